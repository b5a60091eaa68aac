"""Regenerate the .msh files from the .geo sources: ``python meshes/generate.py``."""

from pathlib import Path

import gmsh

HERE = Path(__file__).parent
DIMS = {"interval": 1, "disk": 2, "rectangle": 2}

if __name__ == "__main__":
    gmsh.initialize()
    gmsh.option.setNumber("General.Terminal", 0)
    for name, dim in DIMS.items():
        gmsh.clear()
        gmsh.open(str(HERE / f"{name}.geo"))
        gmsh.model.mesh.generate(dim)
        gmsh.option.setNumber("Mesh.MshFileVersion", 4.1)
        gmsh.write(str(HERE / f"{name}.msh"))
    gmsh.finalize()

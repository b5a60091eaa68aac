"""Benchmark: weak scaling of the box token velocity, gathered μ against the gather-free reduction.

One velocity evaluation (one SSP-RK3 stage of a box transport step; a step makes three) on 1, 2, 3 ranks with the
cells per rank fixed (d = 1 intervals; d = 2 quadrilaterals, a tensor grid, and triangles with the interior
vertices moved smoothly, an unstructured mesh to the kernels; DG1, 9 heads), by the gathered path (every rank
Allgathervs the N_y quadrature weights of μ, then evaluates the kernel at its vertices:
:meth:`mfpde.tokens.box.quadrature.TokenQuadrature.gather`) and by the gather-free one (each rank sums its own
quadrature points on the Chebyshev grid of the global box, one reduction:
:mod:`mfpde.tokens.box.reduced`). Prints a markdown table per d = 1, 2: the kernel's wall and CPU time per
evaluation (medians over ``--repeat``, the slowest rank), the messages per evaluation and the bytes each rank
receives in them (counted by wrapping the communicator; an allreduce moves about twice that), the path the default
(``VelocityOperator.gather_free = None``) takes, and the largest difference between the two fields.

Run from the repository root: ``python bench/bench_box_scaling.py`` (it launches ``mpiexec -n P`` for each P of
``--ranks``; a minute on two cores). The worker mode (``--worker``) is what each ``mpiexec`` runs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from mpi4py import MPI

import dolfinx.fem
import numpy as np

from mfpde.heads import HeadMeasure
from mfpde.mesh import box
from mfpde.tokens.box.transport import TokenTransport

ROOT = Path(__file__).resolve().parent.parent
#: The heads: 9 distinct a in [0, 1.5] with positive c (a Gaussian-like ρ reduced to its a-values).
HEADS = HeadMeasure(np.linspace(0.0, 1.5, 9), np.exp(-((np.linspace(0.0, 1.5, 9) - 0.75) ** 2) / 0.2) / 4.0)


class CountingComm:
    """A communicator that counts the collectives the velocity makes and the bytes each rank receives in them."""

    def __init__(self, comm: MPI.Comm) -> None:
        self._comm, self.calls, self.bytes = comm, 0, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._comm, name)

    def Allreduce(self, sendbuf: Any, recvbuf: Any, op: MPI.Op = MPI.SUM) -> None:  # noqa: N802 (mpi4py's name)
        self.calls += 1
        self.bytes += np.asarray(recvbuf).nbytes
        self._comm.Allreduce(sendbuf, recvbuf, op=op)

    def Allgatherv(self, sendbuf: Any, recvbuf: Any) -> None:  # noqa: N802
        self.calls += 1
        self.bytes += np.asarray(recvbuf[0]).nbytes
        self._comm.Allgatherv(sendbuf, recvbuf)

    def allreduce(self, obj: Any, op: MPI.Op = MPI.SUM) -> Any:
        self.calls += 1
        self.bytes += 8
        return self._comm.allreduce(obj, op=op)


def _measure(d: int, cells_per_rank: int, repeat: int, cell: str = "quadrilateral") -> dict[str, Any]:
    comm = MPI.COMM_WORLD
    per_square = 2 if cell == "triangle" else 1
    n = round((cells_per_rank * comm.size / per_square) ** (1.0 / d))
    domain = box(comm, [[-2.0, 2.0]] * d, [n] * d, cell)
    if cell == "triangle":  # interior vertices moved smoothly: no tensor grid, the kernels' unstructured path
        x = domain.mesh.geometry.x
        x[:, 0] += 0.05 * np.sin(np.pi * x[:, 0] / 2) * np.sin(np.pi * x[:, 1] / 2) ** 2
    tt = TokenTransport(domain, degree=1)
    u = dolfinx.fem.Function(tt.W)
    u.interpolate(lambda x: np.exp(-((x[0] - 0.3) ** 2 + (x[1] + 0.2) ** 2) / 0.5))
    v = tt.velocity
    counter = CountingComm(comm)
    v.comm = tt.quad.comm = counter  # type: ignore[assignment]
    out: dict[str, Any] = {"d": d, "cell": cell, "ranks": comm.size, "cells": per_square * n**d,
                           "n_y": int(tt.quad.counts.sum()),
                           "vertices_per_rank": comm.allreduce(v.n_owned, op=MPI.MAX) // 1}
    fields = {}
    for mode in (False, True):  # the gathered paths, then the gather-free one (forced, on one rank too)
        v.gather_free = mode
        v.update(u, HEADS)  # warm (caches, first-touch)
        wall, cpu = [], []
        for _ in range(repeat):
            comm.Barrier()
            counter.calls = counter.bytes = 0
            t0, c0 = time.perf_counter(), time.process_time()
            v.update(u, HEADS)
            wall.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
        key = "reduced" if mode else "gathered"
        out[key] = {"path": v.path, "wall_ms": 1e3 * comm.allreduce(float(np.median(wall)), op=MPI.MAX),
                    "cpu_ms": 1e3 * comm.allreduce(float(np.median(cpu)), op=MPI.MAX),
                    "messages": counter.calls, "bytes": counter.bytes}
        fields[key] = v.field.x.array.copy()
    v.gather_free = None  # the default's choice (VelocityOperator.gather_free), on a fresh degree
    v._reduced_degree = 16
    v.update(u, HEADS)
    out["auto"] = v.path
    out["max_diff"] = comm.allreduce(float(np.abs(fields["reduced"] - fields["gathered"]).max(initial=0.0)),
                                     op=MPI.MAX)
    return out


def worker(args: argparse.Namespace) -> None:
    rows = [_measure(d, c, args.repeat, cell) for d, c, cell in
            ((1, args.cells_1d, "interval"), (2, args.cells_2d, "quadrilateral"), (2, args.cells_2d, "triangle"))]
    if MPI.COMM_WORLD.rank == 0:
        Path(args.worker).write_text(json.dumps(rows))


def _table(rows: list[dict[str, Any]]) -> str:
    head = ("| d, cell | ranks | cells | N_y | gathered: wall / CPU ms | msgs, bytes/rank "
            "| gather-free: wall / CPU ms | msgs, bytes/rank | default path | max diff |\n" + "|---" * 10 + "|")
    lines = [head]
    for r in rows:
        g, f = r["gathered"], r["reduced"]
        lines.append(f"| {r['d']}, {r['cell']} | {r['ranks']} | {r['cells']} | {r['n_y']} "
                     f"| {g['wall_ms']:.1f} / {g['cpu_ms']:.1f} | {g['messages']}, {g['bytes']} "
                     f"| {f['wall_ms']:.1f} / {f['cpu_ms']:.1f} | {f['messages']}, {f['bytes']} "
                     f"| {r['auto']} | {r['max_diff']:.1e} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 3], help="rank counts (mpiexec -n P each)")
    p.add_argument("--cells-1d", type=int, default=4000, help="cells per rank, d = 1 (DG1)")
    p.add_argument("--cells-2d", type=int, default=4096, help="cells per rank, d = 2 (quadrilaterals, triangles; DG1)")
    p.add_argument("--repeat", type=int, default=5, help="evaluations timed per path (median)")
    p.add_argument("--json", type=Path, help="write the rows here as well")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    mpiexec = Path(sys.executable).parent / "mpiexec"
    rows: list[dict[str, Any]] = []
    for n in args.ranks:
        tmp = ROOT / "out" / f"bench_box_scaling_{os.getpid()}_{n}.json"
        tmp.parent.mkdir(exist_ok=True)
        cmd = [str(mpiexec if mpiexec.exists() else "mpiexec"), "-n", str(n), sys.executable, __file__,
               "--worker", str(tmp), "--cells-1d", str(args.cells_1d), "--cells-2d", str(args.cells_2d),
               "--repeat", str(args.repeat)]
        subprocess.run(cmd, check=True, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1",
                                                       "OPENBLAS_NUM_THREADS": "1"})
        rows += json.loads(tmp.read_text())
        tmp.unlink()
    rows.sort(key=lambda r: (r["d"], r["cell"], r["ranks"]))
    print(_table(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

# mfpde in a container. Users: `docker build -t mfpde .` (official python:3.13-slim base).
# CI without a registry: `.ci/docker-smoke` builds a Debian trixie stand-in base and passes
# `--build-arg BASE=localhost/mfpde-base:trixie`.
#   docker run --rm --user "$(id -u):$(id -g)" -v "$PWD/out:/work/out" IMAGE    -> mfpde run (the main job)
#   docker run --rm --shm-size=1g ... IMAGE mpiexec -n 4 mfpde run              -> the same on 4 MPI ranks
# (MPICH from the wheel talks through /dev/shm, 64 MB by default in Docker: a bus error without --shm-size.)
ARG BASE=python:3.13-slim
FROM ${BASE}

# gcc + libc6-dev + Python.h: FFCx JIT-compiles forms into CFFI extension modules at run time.
# python:3.13-slim ships Python.h; Debian's own python3 needs python3-dev for it.
# The rest: shared libraries that the gmsh wheel's libgmsh.so links against (GLU/GL, X11 bits, OpenMP).
# apt-get runs only if something is missing, so a base that already has them needs no network here.
ARG DEBIAN_FRONTEND=noninteractive
RUN set -eux; \
    pkgs="gcc libc6-dev libglu1-mesa libgl1 libxrender1 libxcursor1 libxfixes3 libxext6 libxft2 \
          libxinerama1 libx11-6 libfontconfig1 libgomp1"; \
    python3 -c 'import os, sysconfig; assert os.path.exists(sysconfig.get_path("include") + "/Python.h")' \
        2>/dev/null || pkgs="$pkgs python3-dev"; \
    missing=""; \
    for p in $pkgs; do \
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q ' ok installed$' || missing="$missing $p"; \
    done; \
    if [ -n "$missing" ]; then \
        apt-get update -q; \
        apt-get install -y -q --no-install-recommends $missing; \
        rm -rf /var/lib/apt/lists/*; \
    fi

ENV VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH \
    XDG_CACHE_HOME=/tmp/cache \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1

# Dependencies first, in their own layer, so that editing the code does not reinstall DOLFINx.
COPY pyproject.toml /tmp/deps/pyproject.toml
RUN set -eux; \
    python3 -m venv /opt/venv; \
    pip install -q --upgrade pip; \
    python3 -c "import tomllib; print('\n'.join(tomllib.load(open('/tmp/deps/pyproject.toml', 'rb'))['project']['dependencies']))" \
        > /tmp/deps/requirements.txt; \
    pip install -q -r /tmp/deps/requirements.txt; \
    rm -rf /tmp/deps

# The repo (demos, meshes, ...) stays at /src; the package itself is installed into the venv.
# The check imports mpi4py first: it loads the wheel's libmpi.so.12, which DOLFINx's RPATH does not name.
COPY . /src
RUN set -eux; \
    pip install -q /src; \
    rm -rf /src/build /src/*.egg-info; \
    python3 -c "from mpi4py import MPI; import dolfinx, gmsh, mfpde; print('mfpde', mfpde.__version__, 'dolfinx', dolfinx.__version__)"; \
    command -v mfpde; command -v mpiexec

WORKDIR /work
CMD ["mfpde", "run"]

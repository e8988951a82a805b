#!/usr/bin/env bash
# Run on the development machine (which reaches the package registry) before a
# `run` of benchmarks/device_check.sh: the GPU machine's python3 (3.12) holds
# torch, torchvision, psutil, nvidia-ml-py, pytest and pytest-xdist, but not
# optuna and its database layer, and nothing can be fetched there; its typer
# may be older than ours (typer 0.29 needs pydantic, also carried). This puts
# their wheels, the versions the tests run with here, in .whl (git-excluded),
# which the `run` call carries: carry [".whl"].
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qxF '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .whl optuna==5.1.0 alembic==1.20.1 sqlalchemy==2.1.9 colorlog==6.12.0 mako==1.4.3 typer==0.29.2 rich==15.0.0 \
    pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 typing-extensions==4.16.0 annotated-doc==0.0.7
ls -la .whl

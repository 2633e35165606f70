#!/bin/sh
# Build the Firecracker manager image from this repository: ./docker/firecracker-manager/build.sh [TAG]
# The context holds a wheelhouse made on this host with the project's own pip (Corral and its dependencies), so
# the image build needs no package index; only Debian's archive for iproute2, iptables and e2fsprogs.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
tag=${1:-corral/firecracker-manager:latest}
ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT
mkdir -p "$ctx/context"
cp "$here/Dockerfile" "$ctx/Dockerfile"
cp "$repo/pyproject.toml" "$repo/README.md" "$ctx/context/"
cp -r "$repo/src" "$ctx/context/src"
find "$ctx/context" -name __pycache__ -type d -prune -exec rm -rf {} +
rm -rf "$ctx/context/src/"*.egg-info
pip=${PIP:-"$repo/.venv/bin/python -m pip"}
$pip wheel --quiet --wheel-dir "$ctx/wheels" "$ctx/context"
rm -rf "$ctx/context"
docker build --force-rm -t "$tag" "$ctx"

#!/usr/bin/env bash
# `make image`: build the Dockerfile into $IMAGE with podman (or IMAGE_TOOL=docker), then say
# how long it took, how large the image is and what its size is made of.
#
# IMAGE_BASE picks the base image, the Dockerfile's one build argument:
#   python  the Python image from Docker Hub (docker.io/library/python:3.11-slim-bookworm)
#   debian  Debian bookworm with python3 and python3-venv, made here from Debian's packages
#           by mmdebstrap and imported as localhost/debian-base:bookworm (made once, kept)
#   auto    python where the registry answers, else debian (the default)
set -euo pipefail
cd "$(dirname "$0")/.."

image=${IMAGE:?IMAGE names the image to build, e.g. materializer:0.1.0}
tool=${IMAGE_TOOL:-podman}
base=${IMAGE_BASE:-auto}
python_base=docker.io/library/python:3.11-slim-bookworm
debian_base=localhost/debian-base:bookworm
# The build trusts what this machine trusts, a proxy's certificate authority included.
ca_bundle=${CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}
export CONTAINERS_CONF=${CONTAINERS_CONF:-$PWD/image/containers.conf}

command -v "$tool" >/dev/null || {
    echo "make image: $tool is not installed (Debian: make image-tools, as root)" >&2
    exit 1
}

debian_base_image() {
    if "$tool" image inspect "$debian_base" >/dev/null 2>&1; then
        echo "base: $debian_base (made earlier)"
        return
    fi
    command -v mmdebstrap >/dev/null || {
        echo "make image: mmdebstrap makes the Debian base; install it (apt-get install mmdebstrap)" >&2
        exit 1
    }
    local rootfs
    rootfs=$(mktemp -d)
    trap 'rm -rf "$rootfs"' RETURN
    echo "base: making $debian_base from Debian's packages (mmdebstrap)"
    mmdebstrap --quiet --variant=minbase --include=python3,python3-venv \
        --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
        --dpkgopt='path-exclude=/usr/share/locale/*' \
        bookworm "$rootfs/rootfs.tar"
    "$tool" import --quiet "$rootfs/rootfs.tar" "$debian_base" >/dev/null
}

case $base in
python) base_image=$python_base ;;
debian) debian_base_image; base_image=$debian_base ;;
auto)
    if "$tool" pull --quiet "$python_base" >/dev/null 2>&1; then
        base_image=$python_base
    else
        echo "base: $python_base cannot be pulled (no registry reachable); using a Debian base"
        debian_base_image
        base_image=$debian_base
    fi
    ;;
*) echo "make image: IMAGE_BASE is python, debian or auto, not '$base'" >&2; exit 1 ;;
esac

args=(build --network=host --build-arg "BASE_IMAGE=$base_image" --tag "$image")
[ -s "$ca_bundle" ] && args+=(--secret "id=ca-certificates,src=$ca_bundle")
echo "building $image on $base_image with $tool"
start=$(date +%s)
"$tool" "${args[@]}" .
took=$(($(date +%s) - start))

size=$("$tool" image inspect --format '{{.Size}}' "$image")
echo "built $image in ${took} s: $((size / 1000000)) MB. Its largest parts:"
"$tool" run --rm --net=host "$image" sh -c \
    'du -sm /usr/lib/jvm /opt/materializer/jvm/lib/* /opt/venv/lib/python3.11/site-packages/*' |
    sort -rn | awk 'NR <= 8 {printf "  %6d MB  %s\n", $1, $2}'

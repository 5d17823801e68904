#!/usr/bin/env bash
# Fetch the larger English training corpus into a cache folder outside git
# and verify it.
#
#   scripts/fetch-corpus.sh     # into $CACHEFIT_CACHE/corpus or ~/.cache/cachefit/corpus
#
# english.txt (15.8 MB, 2.87M words of public-domain 19th-century prose) is
# built from two pinned Debian packages, fetched with `apt-get download`:
# r-cran-janeaustenr (Jane Austen's six novels as R data) and
# sword-comm-tdavid (C. H. Spurgeon's "The Treasury of David", a SWORD
# module). scripts/corpus_extract.py (Python standard library only) takes
# the texts out and cleans them; data/README.md has the provenance.
# Both packages and the text are checked against the sha256 sums below.
# Prints the path of english.txt on stdout; everything else goes to stderr.
set -euo pipefail

dir="${CACHEFIT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/cachefit}/corpus"
out="$dir/english.txt"
text_sha256="d51cd31ce4a3aeaedd2b9f394bd47ffcc22b472ce381a06b169d30599a192d0d"
# name, version, sha256 of the .deb (Debian 12 "bookworm", main).
packages=(
    "r-cran-janeaustenr 1.0.0-1 df6bddf211906d1ff404f8ff662c21b34e6660e7f54a311084e749050c019c95"
    "sword-comm-tdavid 2.1-1 bcbfad701c5c4a061475b58309cebc42755a59e87478c8355227c5e046412b3f"
)

die() {
    echo "error: $*" >&2
    exit 1
}

if [ -f "$out" ] && echo "$text_sha256  $out" | sha256sum -c --status; then
    echo "ok: $out" >&2
    echo "$out"
    exit 0
fi
mkdir -p "$dir"

debs=()
for entry in "${packages[@]}"; do
    read -r name version sha <<<"$entry"
    deb="$dir/${name}_${version}_all.deb"
    if ! { [ -f "$deb" ] && echo "$sha  $deb" | sha256sum -c --status; }; then
        command -v apt-get >/dev/null ||
            die "apt-get not found: $name $version is a Debian package (fetch it on a Debian machine and put it at $deb)"
        tmp="$(mktemp -d)"
        # apt downloads as its unprivileged `_apt` user when it can write
        # there (else it warns and downloads as root).
        if [ "$(id -u)" = 0 ] && id _apt >/dev/null 2>&1; then
            chown _apt "$tmp"
        fi
        echo "downloading $name $version with apt-get ..." >&2
        # apt-get downloads into the current folder.
        if ! (cd "$tmp" && apt-get download -q=2 "$name=$version" >&2); then
            rm -rf "$tmp"
            die "apt-get download $name=$version failed: run 'apt-get update' and check 'apt-cache policy $name' lists version $version"
        fi
        mv "$tmp/${name}_${version}_all.deb" "$deb.part"
        rm -rf "$tmp"
        if ! echo "$sha  $deb.part" | sha256sum -c --status; then
            rm -f "$deb.part"
            die "SHA-256 of $name $version does not match $sha"
        fi
        mv "$deb.part" "$deb"
    fi
    debs+=("$deb")
done

echo "extracting and cleaning the text ..." >&2
python3 "$(dirname "$0")/corpus_extract.py" "${debs[@]}" "$out.part" ||
    die "could not extract the text from ${debs[*]}"
if ! echo "$text_sha256  $out.part" | sha256sum -c --status; then
    got="$(sha256sum "$out.part" | cut -d' ' -f1)"
    rm -f "$out.part"
    die "SHA-256 of the extracted english.txt is $got, expected $text_sha256 (was scripts/corpus_extract.py changed?)"
fi
mv "$out.part" "$out"
echo "fetched: $out" >&2
echo "$out"

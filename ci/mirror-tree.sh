#!/usr/bin/env bash
# Makes TO an exact copy of the git work tree FROM (its tracked files and the
# untracked ones git does not ignore), touching only the files that differ:
# a file whose bytes, mode or link target are already right keeps its time.
#
#     bash ci/mirror-tree.sh FROM TO
#
# ci/test.sh builds from such a copy at a fixed place in the build folder:
# cargo rebuilds a crate when a source file is newer than its last build, and
# rustc's incremental caches are keyed by the sources' paths, so a fresh clone
# (new paths, every file new) would otherwise compile the whole workspace
# again although only the changed files differ.
set -euo pipefail
[ $# -eq 2 ] || { echo "usage: bash ci/mirror-tree.sh FROM TO" >&2; exit 2; }
from="$(cd "$1" && pwd -P)"
mkdir -p "$2"
to="$(cd "$2" && pwd -P)"
[ "$from" != "$to" ] || exit 0

wanted="$(mktemp)"
present="$(mktemp)"
trap 'rm -f "$wanted" "$present"' EXIT
(cd "$from" && git ls-files -z --cached --others --exclude-standard) | tr '\0' '\n' | sort -u > "$wanted"

cd "$from"
copied=0
while IFS= read -r f; do
    if [ -L "$f" ]; then
        # A link is copied as a link (the model folders share components by links to folders).
        if [ ! -L "$to/$f" ] || [ "$(readlink "$f")" != "$(readlink "$to/$f")" ]; then
            mkdir -p "$to/$(dirname "$f")"
            rm -rf "$to/$f"
            ln -s "$(readlink "$f")" "$to/$f"
            copied=$((copied + 1))
        fi
    elif [ -f "$f" ]; then
        if [ -L "$to/$f" ] || ! cmp -s "$f" "$to/$f" || [ "$(stat -c %a "$f")" != "$(stat -c %a "$to/$f")" ]; then
            mkdir -p "$to/$(dirname "$f")"
            rm -rf "$to/$f"
            cp --preserve=mode "$f" "$to/$f"
            copied=$((copied + 1))
        fi
    fi
    # Anything else (a file deleted from the work tree but still in the index) is not copied.
done < "$wanted"

# What the copy holds that the tree no longer does (a deleted file, or
# something a run wrote beside the sources) goes.
(cd "$to" && find . \( -type f -o -type l \) -print | sed 's|^\./||' | sort) > "$present"
removed=0
while IFS= read -r f; do
    rm -f "$to/$f"
    removed=$((removed + 1))
done < <(comm -13 "$wanted" "$present")
echo "source copy: $to ($copied files written, $removed removed, the rest as they were)"

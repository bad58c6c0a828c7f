#!/bin/sh
# Makes .device/src: the committed tree (HEAD, or REV) with its autotools
# output, for a GPU machine that has no autotools, while the working tree
# may hold others' unfinished edits. Run there as
#   cd .device/src && tests/gpu/run-all.sh $OUT PART...
# (.device/src/.device points back at .device for root/ and hf/).
set -eu
rev=${1:-HEAD}
top=$(git rev-parse --show-toplevel)
dst=$top/.device/src
rm -rf "$dst" && mkdir -p "$dst"
git -C "$top" archive "$rev" | tar -x -C "$dst"
(cd "$dst" && autoreconf -fi >/dev/null 2>&1 && rm -rf autom4te.cache)
ln -s .. "$dst/.device"
git -C "$top" rev-parse --short "$rev" >"$dst/REVISION" # what bench headers name
echo "$(git -C "$top" rev-parse --short "$rev") -> $dst ($(du -sh "$dst" | cut -f1))"

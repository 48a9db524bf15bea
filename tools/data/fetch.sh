#!/usr/bin/env bash
# Fetches and prepares moh's real text corpora from Debian packages.
#
#   tools/data/fetch.sh [ROOT]        ROOT defaults to <repo>/data
#
# Installs bible-kjv, bible-kjv-text and fortunes with apt-get when they are missing (sudo only
# when not root), then writes:
#
#   ROOT/kjv/all.txt      `bible -l79 gen1:1-rev22:21` verbatim: the whole King James Bible, 66 books,
#                         each chapter as "\n<Book> <chapter>\n\n" followed by "  <n> <verse>" lines
#                         wrapped at 79 columns (wrapped continuation lines are not indented).
#   ROOT/kjv/train.txt    all.txt up to the held-out block (cat train.txt val.txt == all.txt).
#   ROOT/kjv/val.txt      a contiguous block of WHOLE books at the end of the Bible: it starts at the
#                         book boundary nearest to the last KJV_VAL_FRACTION (default 0.05) of the
#                         bytes. With the Debian 4.38 text that is Colossians .. Revelation (16
#                         books, 216,748 bytes, 5.04%). Lines are never interleaved or split.
#   ROOT/kjv/books.tsv    book, first byte offset in all.txt, bytes, split (train|val).
#   ROOT/fortunes/<topic>.txt   each topic file of /usr/share/games/fortunes copied verbatim
#                         (entries separated by lines holding "%"; .dat indexes, .u8 links and
#                         symlinks to another topic are skipped).
#   ROOT/fortunes/topics.txt    "<topic>\t<bytes>\t<entries>" per topic, sorted by name.
#
# Idempotent: a corpus whose outputs all exist is not rebuilt (FORCE=1 rebuilds, e.g. after changing
# KJV_VAL_FRACTION). Outputs are built in a temporary directory and moved into place at the end, so
# an interrupted run leaves nothing half-written. Prints a summary: bytes per split and the order-0
# entropy (bits/byte) of each. Needs bash, coreutils, awk; python3 is used for entropy if present.
set -euo pipefail

die() { echo "fetch.sh: error: $*" >&2; exit 1; }

repo=$(cd "$(dirname "$0")/../.." && pwd)
root=${1:-$repo/data}
force=${FORCE:-0}
val_fraction=${KJV_VAL_FRACTION:-0.05}
fortune_dir=${FORTUNE_DIR:-/usr/share/games/fortunes}
export LC_ALL=C # byte semantics for awk length(), sort and tr

[[ $val_fraction =~ ^0\.[0-9]*[1-9][0-9]*$ ]] ||
  die "KJV_VAL_FRACTION must be a decimal in (0, 1), e.g. 0.05 (got '$val_fraction')"

# ---- packages ------------------------------------------------------------------------------------
have_bible() { command -v bible >/dev/null 2>&1 && (cd / && bible gen1:1 2>/dev/null | grep -q 'In the beginning'); }
have_fortunes() { [ -d "$fortune_dir" ] && [ -f "$fortune_dir/art" ]; }

need=()
have_bible || need+=(bible-kjv bible-kjv-text)
have_fortunes || need+=(fortunes)
if [ ${#need[@]} -gt 0 ]; then
  command -v apt-get >/dev/null 2>&1 ||
    die "missing Debian packages ${need[*]} and no apt-get on this machine; install them another way (the bible program and $fortune_dir are needed)"
  sudo=()
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null 2>&1 || die "need root or sudo to install ${need[*]}"
    sudo=(sudo)
  fi
  echo "fetch.sh: installing ${need[*]}" >&2
  "${sudo[@]}" apt-get update -qq || die "apt-get update failed"
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq "${need[@]}" >/dev/null ||
    die "apt-get install ${need[*]} failed"
  have_bible || die "bible-kjv is installed but 'bible gen1:1' prints no text"
  have_fortunes || die "fortunes is installed but $fortune_dir/art is missing"
fi

mkdir -p "$root" || die "cannot create $root"
root=$(cd "$root" && pwd)
tmp=$(mktemp -d "$root/.fetch.XXXXXX") || die "cannot create a temporary directory in $root"
trap 'rm -rf "$tmp"' EXIT

# ---- helpers -------------------------------------------------------------------------------------
fsize() { wc -c <"$1" | tr -d ' '; }

# Order-0 entropy in bits/byte of file $1 (python3 when present, else od + awk).
entropy() {
  if command -v python3 >/dev/null 2>&1; then
    python3 -c '
import math, sys
from collections import Counter
b = open(sys.argv[1], "rb").read()
n = len(b)
print("%.4f" % (-sum(c / n * math.log2(c / n) for c in Counter(b).values()) if n else 0.0))' "$1"
  else
    od -An -v -tu1 "$1" | awk '{ for (i = 1; i <= NF; i++) { c[$i]++; n++ } }
      END { h = 0; for (k in c) { p = c[k] / n; h -= p * log(p) / log(2) }; printf "%.4f\n", h }'
  fi
}

# ---- King James Bible ----------------------------------------------------------------------------
kjv=$root/kjv
if [ "$force" != 1 ] && [ -s "$kjv/all.txt" ] && [ -s "$kjv/train.txt" ] && [ -s "$kjv/val.txt" ] &&
   [ -s "$kjv/books.tsv" ]; then
  echo "kjv: already prepared in $kjv (FORCE=1 to rebuild)"
else
  mkdir -p "$tmp/kjv"
  # -l79: fixed wrap width (the default follows $COLUMNS); run from / so that no bible.data in the
  # current directory shadows the packaged text.
  (cd / && bible -l79 gen1:1-rev22:21) >"$tmp/kjv/all.txt" || die "bible gen1:1-rev22:21 failed"
  total=$(fsize "$tmp/kjv/all.txt")
  [ "$total" -gt 4000000 ] || die "bible printed only $total bytes (expected about 4.3 MB)"
  [ "$(tail -c1 "$tmp/kjv/all.txt" | od -An -tu1 | tr -d ' ')" = 10 ] ||
    die "bible output does not end with a newline"

  # Book starts: the blank line before a "<Book> 1" heading that is itself followed by a blank line.
  # Output: byte offset of that blank line, TAB, book name.
  awk '
    { line[NR % 3] = $0; start[NR % 3] = off; off += length($0) + 1 }
    NR >= 3 {
      a = (NR - 2) % 3; h = (NR - 1) % 3; c = NR % 3
      if (line[a] == "" && line[c] == "" && line[h] ~ / 1$/ && line[h] !~ /^ /) {
        name = line[h]; sub(/ 1$/, "", name); printf "%d\t%s\n", start[a], name
      }
    }' "$tmp/kjv/all.txt" >"$tmp/kjv/starts.tsv"
  nbooks=$(wc -l <"$tmp/kjv/starts.tsv" | tr -d ' ')
  [ "$nbooks" -eq 66 ] || die "found $nbooks book headings in the bible output, expected 66 (format changed?)"
  [ "$(head -n1 "$tmp/kjv/starts.tsv")" = "0	Genesis" ] || die "bible output does not start with Genesis 1"

  # Boundary: the book start nearest to total * (1 - val_fraction), never Genesis.
  cut=$(awk -F'\t' -v total="$total" -v f="$val_fraction" '
    NR > 1 { d = $1 - total * (1 - f); if (d < 0) d = -d; if (best == "" || d < best) { best = d; off = $1 } }
    END { print off }' "$tmp/kjv/starts.tsv")
  head -c "$cut" "$tmp/kjv/all.txt" >"$tmp/kjv/train.txt"
  tail -c +"$((cut + 1))" "$tmp/kjv/all.txt" >"$tmp/kjv/val.txt"
  cat "$tmp/kjv/train.txt" "$tmp/kjv/val.txt" | cmp -s - "$tmp/kjv/all.txt" ||
    die "internal: train.txt + val.txt differ from all.txt"
  awk -F'\t' -v total="$total" -v cut="$cut" '
    { off[NR] = $1; name[NR] = $2 }
    END {
      print "book\toffset\tbytes\tsplit"
      for (i = 1; i <= NR; i++) {
        end = (i < NR) ? off[i + 1] : total
        printf "%s\t%d\t%d\t%s\n", name[i], off[i], end - off[i], (off[i] >= cut) ? "val" : "train"
      }
    }' "$tmp/kjv/starts.tsv" >"$tmp/kjv/books.tsv"
  rm -f "$tmp/kjv/starts.tsv"
  mkdir -p "$kjv"
  for f in all.txt train.txt val.txt books.tsv; do mv -f "$tmp/kjv/$f" "$kjv/$f"; done
  echo "kjv: wrote $kjv"
fi

# ---- fortunes ------------------------------------------------------------------------------------
fort=$root/fortunes
if [ "$force" != 1 ] && [ -s "$fort/topics.txt" ]; then
  echo "fortunes: already prepared in $fort (FORCE=1 to rebuild)"
else
  have_fortunes || die "$fortune_dir/art not found (set FORTUNE_DIR or install the fortunes package)"
  mkdir -p "$tmp/fortunes"
  : >"$tmp/fortunes/topics.txt"
  src_real=$(cd "$fortune_dir" && pwd -P)
  for f in "$fortune_dir"/*; do
    name=${f##*/}
    case $name in *.dat | *.u8 | .*) continue ;; esac
    if [ -L "$f" ]; then
      target=$(readlink -f "$f") || continue
      tname=${target##*/}
      # A link to another topic file in the same directory holds the same text: skip it.
      if [ "${target%/*}" = "$src_real" ] && [ "$tname" != "$name" ] && [ -f "$target" ]; then
        case $tname in *.dat | *.u8) ;; *) continue ;; esac
      fi
    fi
    [ -f "$f" ] || continue
    [ -r "$f" ] || die "cannot read $f"
    cp -L "$f" "$tmp/fortunes/$name.txt"
    entries=$(awk '$0 == "%" { n++; prev = 1; next } { if (prev != 0) { prev = 0; e++ } }
                   END { print e + 0 }' prev=1 "$f")
    printf '%s\t%s\t%s\n' "$name" "$(fsize "$f")" "$entries" >>"$tmp/fortunes/topics.txt"
  done
  [ -s "$tmp/fortunes/topics.txt" ] || die "no topic files found in $fortune_dir"
  sort -o "$tmp/fortunes/topics.txt" "$tmp/fortunes/topics.txt"
  mkdir -p "$fort"
  for f in "$tmp"/fortunes/*.txt; do
    [ "${f##*/}" = topics.txt ] || mv -f "$f" "$fort/"
  done
  mv -f "$tmp/fortunes/topics.txt" "$fort/topics.txt" # last: marks the corpus complete
  echo "fortunes: wrote $fort"
fi

# ---- summary -------------------------------------------------------------------------------------
echo
echo "== King James Bible ($kjv)"
for s in all train val; do
  printf '  %-6s %9s bytes  %s bits/byte (order-0)\n' "$s" "$(fsize "$kjv/$s.txt")" "$(entropy "$kjv/$s.txt")"
done
held=$(awk -F'\t' '$4 == "val" { n++; s = s (s == "" ? "" : ", ") $1 } END { printf "%d books: %s", n, s }' "$kjv/books.tsv")
echo "  val holds $held"
echo "== fortunes ($fort)"
awk -F'\t' '{ n++; b += $2; e += $3 } END { printf "  %d topics, %d bytes, %d entries\n", n, b, e }' "$fort/topics.txt"

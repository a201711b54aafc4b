#!/usr/bin/env bash
# Makes (once per machine) the Python environment the PyTorch front end's tests
# and main job use: a venv from Debian's python3 with torch, transformers and
# pytest from PyPI. PyPI's torch wheel is large, so the venv lives outside the
# checkout (ZO_VENV, default ~/.cache/zoffload/venv) where every clone and
# every rerun finds it; a stamp records what was installed, so a rerun installs
# nothing. Prints the venv's python on its last line.
set -euo pipefail
venv=${ZO_VENV:-$HOME/.cache/zoffload/venv}
want="torch==2.15.0 transformers==5.24.0 pytest numpy"
stamp=$venv/.zoffload-stamp
if [ ! -x "$venv/bin/python" ]; then
  echo "zoffload: making the Python venv $venv" >&2
  /usr/bin/python3 -m venv "$venv" >&2
fi
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "zoffload: installing $want into $venv (once per machine)" >&2
  # shellcheck disable=SC2086
  "$venv/bin/pip" install -q --disable-pip-version-check $want >&2
  echo "$want" >"$stamp"
fi
echo "$venv/bin/python"

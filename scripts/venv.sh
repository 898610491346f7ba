# shellcheck shell=bash
# Sourced by scripts/test.sh and scripts/demo.sh, from the repository root. project_venv ARGS...:
# a virtualenv in .venv (made with $PYTHON, default python3, on a fresh clone), an up-to-date
# pip in it, then `pip install ARGS...` there (this checkout with the extras the script needs).
project_venv() {
  if [ ! -x .venv/bin/python ]; then
    "${PYTHON:-python3}" -m venv .venv
  fi
  .venv/bin/python -m pip install --quiet --upgrade pip
  .venv/bin/python -m pip install --quiet "$@"
}

#!/usr/bin/env bash
# Mutation score of steerflow modules against their focused tests (issue 20).
#
#   scripts/mutation.sh MODULE[:FUNC_GLOB,...] ...
#   scripts/mutation.sh checkpoint/_patch.py plan/_model.py
#   scripts/mutation.sh 'state/_db.py:*claim_control*,*finalize_control*'
#
# Each module runs mutmut (configured in pyproject.toml [tool.mutmut]) in a throw-away copy of
# the repo, so the working tree never sees a mutant, against only the tests in the table below:
# the whole suite would take hours per module. Prints one line per module:
#   MODULE killed/total score%
# "killed" counts mutants a test failed on (or timed out on); every other mutant, including the
# ones no selected test reaches, counts against the score. Survivors that docs/mutation.md lists
# as equivalent (by full mutant name, in backticks) are then left out of a second, bracketed
# score. Survivors are listed, with their diffs, in $MUTATION_OUT (default: a fresh directory,
# printed at the end).
#
# Environment: MUTATION_JOBS (parallel workers, default 2), MUTATION_TIME_LIMIT (seconds per
# module, default 1800; a module cut short reports its unchecked mutants), MUTATION_OUT.
# Too slow for .ci/run: run it by hand when changing a module below or its tests.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
MUTMUT=${MUTMUT:-$ROOT/.venv/bin/mutmut}
PYTHON=${PYTHON:-$ROOT/.venv/bin/python}
JOBS=${MUTATION_JOBS:-2}
LIMIT=${MUTATION_TIME_LIMIT:-1800}
OUT=${MUTATION_OUT:-$(mktemp -d "${TMPDIR:-/tmp}/steerflow-mutation-out.XXXXXX")}
mkdir -p "$OUT"

# module (relative to src/steerflow) -> the tests aimed at it
tests_for() {
  case "$1" in
    checkpoint/_patch.py)
      echo tests/checkpoint/test_patch.py tests/checkpoint/test_patch_conformance.py ;;
    checkpoint/_digest.py)
      echo tests/checkpoint/test_digest_known_answers.py tests/checkpoint/test_spawned_ids.py \
        tests/checkpoint/test_identity_digest.py tests/checkpoint/test_output_member.py ;;
    checkpoint/_load_v3.py)
      echo tests/checkpoint/test_load_v3.py tests/checkpoint/test_load_dispatch.py \
        tests/checkpoint/test_refusal_names.py ;;
    checkpoint/_load_v4.py)
      echo tests/checkpoint/test_load_v4.py tests/checkpoint/test_load_v4_coherent.py \
        tests/checkpoint/test_load_dispatch.py \
        tests/checkpoint/test_v4_mutations.py tests/checkpoint/test_golden.py \
        tests/checkpoint/test_v4_journal_segments.py tests/checkpoint/test_v4_memory.py \
        "tests/checkpoint/test_v3_writer.py::test_reader_sees_coherent_state_during_compactions" ;;
    checkpoint/_entries.py)
      # the one entry validator for both versions (moved out of _load_v3.py by issue 16)
      echo tests/checkpoint/test_load_v3.py tests/checkpoint/test_load_dispatch.py \
        tests/checkpoint/test_refusal_names.py tests/checkpoint/test_golden.py \
        tests/checkpoint/test_spawned_ids.py tests/checkpoint/test_entries_refusals.py ;;
    plan/_model.py | plan/_load.py)
      # the CLI run is a subprocess: it imports the unmutated tree and only costs time
      echo tests/plan/test_plan_model.py tests/plan/test_playbooks.py \
        tests/plan/test_plan_hostile.py tests/artifacts/test_artifact_contract.py \
        --deselect=tests/plan/test_playbooks.py::test_play_and_flow_p_run_a_home_playbook ;;
    control/_queue.py)
      echo tests/control/test_queue.py ;;
    control/_poller.py)
      # the source scan would count mutmut's copies of the poller's functions as callers;
      # test_poller_listen.py holds the LISTEN path (PostgreSQL), which SQLite never takes
      echo tests/control/test_poller.py tests/control/test_poller_timing.py \
        tests/control/test_phase_owner.py tests/control/test_poller_turn_boundary.py \
        tests/control/test_poller_listen.py \
        --deselect=tests/control/test_phase_owner.py::test_only_the_poller_calls_set_session_phase ;;
    state/_db.py)
      echo tests/state/test_state_controls.py tests/state/test_state_resume_claims.py \
        tests/state/test_state_busy.py ;;
    *) return 1 ;;
  esac
}

if [ $# -eq 0 ]; then
  sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
fi

for arg in "$@"; do
  module=${arg%%:*}
  funcs=""
  [ "$arg" != "$module" ] && funcs=${arg#*:}
  if ! tests=$(tests_for "$module"); then
    echo "mutation.sh: no test selection for '$module' (add it to tests_for)" >&2
    exit 2
  fi
  work=$(mktemp -d "${TMPDIR:-/tmp}/steerflow-mutation.XXXXXX")
  # shellcheck disable=SC2064  # expand now: $work changes each iteration
  trap "rm -rf '$work'" EXIT
  tar -C "$ROOT" --exclude=__pycache__ --exclude=.pytest_cache -cf - src tests pyproject.toml \
    | tar -C "$work" -xf -
  # narrow the shared [tool.mutmut] configuration to this module and its tests
  (cd "$work" && "$PYTHON" - "$module" $tests <<'EOF'
import json, re, sys, tomllib
from pathlib import Path

module, tests = sys.argv[1], sys.argv[2:]
path = Path("pyproject.toml")
text = path.read_text()
cfg = tomllib.loads(text).get("tool", {}).get("mutmut", {})
cfg["only_mutate"] = [f"src/steerflow/{module}"]
cfg["pytest_add_cli_args_test_selection"] = tests
text = re.sub(r"(?ms)^\[tool\.mutmut\]\n.*?(?=^\[|\Z)", "", text)
text += "\n[tool.mutmut]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in cfg.items())
path.write_text(text)
EOF
  )
  dotted="steerflow.$(echo "${module%.py}" | tr / .)"
  patterns=()
  if [ -n "$funcs" ]; then
    IFS=, read -ra globs <<<"$funcs"
    for g in "${globs[@]}"; do patterns+=("$dotted.$g"); done
  fi
  label=$arg
  log="$OUT/$(echo "$label" | tr '/:*,' '____').log"
  echo "== $label: mutmut in $work (tests: $tests), log $log" >&2
  rc=0
  (cd "$work" && timeout --signal=INT --kill-after=60 "$LIMIT" \
    "$MUTMUT" run --max-children "$JOBS" "${patterns[@]}") >"$log" 2>&1 || rc=$?
  line=$(cd "$work" && "$PYTHON" - "$module" "$dotted" "$label" "$OUT" "$MUTMUT" \
    "$ROOT/docs/mutation.md" "${patterns[@]}" <<'EOF'
import fnmatch, json, re, subprocess, sys
from pathlib import Path

module, dotted, label, out, mutmut, listed, *patterns = sys.argv[1:]
meta = Path("mutants/src/steerflow") / (module + ".meta")
if not meta.exists():
    print(f"{label} no result (mutmut did not finish generating; see the log)")
    sys.exit()
codes = json.loads(meta.read_text())["exit_code_by_key"]
if patterns:
    codes = {k: v for k, v in codes.items() if any(fnmatch.fnmatch(k, p) for p in patterns)}
# mutmut's exit-code meanings (mutmut/stats.py): 1/3 a test failed, timeouts by SIGXCPU/kill
killed_codes = {1, 3, 36, -24, 24, 152, 255, -9, -11}
killed = sorted(k for k, v in codes.items() if v in killed_codes)
unchecked = sorted(k for k, v in codes.items() if v is None)
survived = sorted(k for k, v in codes.items() if v not in killed_codes and v is not None)
total = len(codes)
score = 100.0 * len(killed) / total if total else 100.0
stem = label.replace("/", "_").replace(":", "_").replace("*", "_").replace(",", "_")


def diff_of(name: str) -> str:
    try:  # in-process: one `mutmut show` per survivor costs a second each
        from mutmut.mutation.diff_apply import get_diff_for_mutant

        return get_diff_for_mutant(name, path=f"src/steerflow/{module}")
    except Exception:
        return subprocess.run([mutmut, "show", name], capture_output=True, text=True).stdout


with open(Path(out) / f"{stem}.survivors.txt", "w") as f:
    for name in survived:
        f.write(f"# {name}: exit code {codes[name]}\n{diff_of(name)}\n\n")
extra = f" ({len(unchecked)} not checked)" if unchecked else ""
# survivors docs/mutation.md lists as equivalent (by full mutant name) leave the denominator
doc = Path(listed).read_text() if Path(listed).exists() else ""
equivalent = set(re.findall(r"`(steerflow\.[^`\s]+__mutmut_\d+)`", doc)) & set(survived)
if equivalent:
    rest = total - len(equivalent)
    adjusted = 100.0 * len(killed) / rest if rest else 100.0
    extra += f" [{len(equivalent)} equivalent: {len(killed)}/{rest} {adjusted:.1f}%]"
print(f"{label} {len(killed)}/{total} {score:.1f}%{extra}")
EOF
  )
  if [ $rc -eq 124 ]; then
    line="$line [time limit of ${LIMIT}s reached]"
  elif [ $rc -ne 0 ]; then
    line="$line [mutmut exit $rc: see $log]"
  fi
  echo "$line"
  rm -rf "$work"
  trap - EXIT
done
echo "survivors and logs: $OUT" >&2

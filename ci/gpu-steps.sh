# Sourced by ci/gpu-run.sh and ci/gpu-decisive.sh (which set `binary` and
# `report`): the run stops at once without the binary; a line into the
# report (`say`), and a command run under its own time limit with its output
# appended to the report as it goes (`step LIMIT TITLE CMD...`, counting
# failures in `failed`).
if [ ! -x "$binary" ]; then
    echo "error: no flux-lite binary at $binary (build it with cargo build --release -p flux-lite-cli and carry it)" >&2
    exit 1
fi

say() { echo "$*" | tee -a "$report"; }

step() {
    local limit="$1" title="$2"
    shift 2
    say ""
    say "== $title: $*"
    timeout "$limit" "$@" 2>&1 | tee -a "$report"
    local status=${PIPESTATUS[0]}
    if [ "$status" -eq 124 ]; then
        say "(stopped after ${limit}s)"
    elif [ "$status" -ne 0 ]; then
        say "(failed: exit status $status)"
    fi
    if [ "$status" -ne 0 ]; then failed=$((failed + 1)); fi
    return 0
}
failed=0

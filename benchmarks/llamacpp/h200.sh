#!/usr/bin/env bash
# A real night of elsa-tune on a lent GPU host (an H200) with llama.cpp, in three steps that fit its 10-minute
# commands and 30-minute sessions. Run from the repository root on the GPU host:
#
#   bash benchmarks/llamacpp/h200.sh setup   # install the wheels carried in .whl/, build llama-server with CUDA
#                                            # from .cache/llama-src.tar.gz (resumable: the build folder is kept),
#                                            # write the models (about 6 min on 16 cores)
#   bash benchmarks/llamacpp/h200.sh night   # start the study (--budget, default 10m) and then the independent
#                                            # check in the background (setsid), and return
#   bash benchmarks/llamacpp/h200.sh wait    # wait (at most WAIT_S, default 570 s) for both; copy what exists
#                                            # to $OUT (study log, report, ledger, check JSON)
#
# Everything runs from a copy of the project outside the checkout (/tmp/elsa-tune); the run folder is
# /tmp/elsa-night/run. The source tarball comes from `python -m elsa_tune.runtime.llamacpp.build --pack`.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
WORK=/tmp/elsa-night
SITE=/tmp/elsa-site
export PYTHONPATH="$SITE" PATH="$SITE/bin:$PATH" PYTHONUNBUFFERED=1
export LD_LIBRARY_PATH="/usr/local/cuda-13.0/lib64:${LD_LIBRARY_PATH:-}"
[ -d /usr/local/cuda-13.0/bin ] && export PATH="/usr/local/cuda-13.0/bin:$PATH"
BUDGET="${BUDGET:-10m}"
PASS_S="${PASS_S:-10}"
SPACE="${SPACE:-llamacpp-gpu-1b}"
OUTDIR="${OUT:-$WORK/out}"

step_setup() {
    mkdir -p "$WORK" "$SITE"
    rm -rf /tmp/elsa-tune && cp -r "$ROOT" /tmp/elsa-tune && rm -rf /tmp/elsa-tune/.whl /tmp/elsa-tune/.cache
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
        "$ROOT"/.whl/*.whl
    # the installed layout (the design card's folders as sub-packages of elsa_tune), without building a wheel
    mkdir -p "$SITE/elsa_tune" "$SITE/bin"
    cp -r /tmp/elsa-tune/elsa_tune/. "$SITE/elsa_tune/"
    for d in search_spaces runtime traffic probes history tuner reports; do cp -r "/tmp/elsa-tune/$d" "$SITE/elsa_tune/$d"; done
    printf '#!/usr/bin/env bash\nexec python3 -m elsa_tune "$@"\n' > "$SITE/bin/elsa-tune" && chmod +x "$SITE/bin/elsa-tune"
    cd "$WORK"
    nvidia-smi --query-gpu=name,uuid,memory.total,driver_version --format=csv,noheader
    time python3 -m elsa_tune.runtime.llamacpp.build --cuda --source "$ROOT/.cache/llama-src.tar.gz" \
        --jobs "$(nproc)" | tail -3
    mkdir -p ~/.cache/elsa-tune/models
    ELSA_LLAMA_SERVER="$(python3 -c 'from elsa_tune.runtime.llamacpp.build import cached_binary; print(cached_binary())')" \
        elsa-tune llamacpp setup --gpu-model
    [ "${START_NIGHT:-0}" = 1 ] && step_night || true
}

step_night() {
    cd "$WORK"
    rm -rf run check.json study.log check.log
    setsid bash -c "elsa-tune --runtime llamacpp --gpu 0 --space $SPACE --traffic demo-chat --budget $BUDGET \
            --pass-seconds $PASS_S --out run --no-live >study.log 2>&1; echo \"study exit \$?\" >>study.log; \
        python3 /tmp/elsa-tune/benchmarks/llamacpp/check.py --run run --space $SPACE --gpu 0 --traffic demo-chat \
            --pass-seconds $PASS_S --boots ${CHECK_BOOTS:-8} --move-boots ${MOVE_BOOTS:-3} --work check-boots \
            --json check.json >check.log 2>&1; echo \"check exit \$?\" >>check.log" </dev/null >/dev/null 2>&1 &
    sleep 5
    tail -5 study.log || true
}

step_wait() {
    cd "$WORK"
    deadline=$((SECONDS + ${WAIT_S:-570}))
    until grep -q "check exit" check.log 2>/dev/null || [ $SECONDS -ge $deadline ]; do sleep 5; done
    mkdir -p "$OUTDIR"
    cp study.log check.log check.json "$OUTDIR"/ 2>/dev/null || true
    [ -d run ] && tar czf "$OUTDIR/run.tar.gz" --exclude='*.db-journal' run 2>/dev/null || true
    tail -25 study.log 2>/dev/null | cut -c1-220 || true
    tail -30 check.log 2>/dev/null || true
}

"step_${1:?setup, night or wait}"

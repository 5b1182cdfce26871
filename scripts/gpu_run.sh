#!/usr/bin/env bash
# One device-machine call: GPU tests and benchmarks, each step with its own time limit.
#   bash scripts/gpu_run.sh STEP...      (steps: see the case below)
# Writes $OUT/summary.txt, $OUT/logs.tgz (every log and benchmark JSON/PNG) and $OUT/cache.tgz
# (Triton's compile cache and tritonad's autotune cache, carried into the next call as
# .gpu-cache/cache.tgz so that nothing is compiled or tuned twice).
set -u
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT/logs" "$OUT/bench"
export PYTHONPATH=$PWD TRITON_CACHE_DIR=/root/.triton/cache TRITONAD_AUTOTUNE_DIR=/root/.cache/tritonad/autotune
if [ -f .gpu-cache/cache.tgz ]; then tar xzf .gpu-cache/cache.tgz -C /root 2>/dev/null; fi

run() {  # run NAME SECONDS CMD...
    local name=$1 limit=$2; shift 2
    local start=$SECONDS
    timeout "$limit" "$@" >"$OUT/logs/$name.log" 2>&1
    local rc=$?
    printf '%-28s rc=%-3s %4ss\n' "$name" "$rc" "$((SECONDS - start))" | tee -a "$OUT/summary.txt"
}

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >>"$OUT/summary.txt"
python3 -c "import torch, triton, numpy; print('torch', torch.__version__, 'triton', triton.__version__, 'numpy', numpy.__version__)" >>"$OUT/summary.txt"
for step in "$@"; do
    case $step in
        gpu-tests)    run gpu-tests "${GPU_TESTS_LIMIT:-560}" python3 -m pytest -m gpu -q -p no:cacheprovider -n 8 --timeout 200 --durations=40 ;;
        gpu-tests-k=*) run "gpu-tests-${step#gpu-tests-k=}" 560 python3 -m pytest -m gpu -q -p no:cacheprovider -k "${step#gpu-tests-k=}" ;;
        gpu-new)      run gpu-new "${GPU_NEW_LIMIT:-240}" python3 -m pytest -q -p no:cacheprovider -n 8 --timeout 200 -m "not gpu" tests/test_norms.py tests/test_attention.py tests/test_indexing.py tests/test_rnn.py tests/test_scan.py tests/test_tensor_ops.py tests/test_losses.py tests/test_small_pieces.py tests/test_amp.py tests/test_autocast.py tests/test_gpt.py tests/test_resnet.py tests/test_plans.py ;;
        cpu-suite)    run cpu-suite 560 python3 -m pytest -q -x -p no:cacheprovider -n 8 ;;
        bench-*)      run "$step" 560 python3 -m tritonad bench "${step#bench-}" --out "$OUT/bench" ;;
        fresh)        rm -rf /root/.triton /root/.cache/tritonad ;;
        before-quick-*) (cd .baseline && PYTHONPATH=$PWD run "$step" 300 python3 benchmarks/bench_${step#before-quick-}.py --out "$OUT/bench/before" --quick) ;;
        quick-*)      run "$step" "${QUICK_LIMIT:-300}" python3 -m tritonad bench "${step#quick-}" --out "$OUT/bench" --quick ;;
        table)        run table "${TABLE_LIMIT:-300}" python3 scripts/make_plan_table.py --out "$OUT/plans.json" --quick ;;
        merge-table)  run merge-table 30 python3 scripts/make_plan_table.py --merge "$OUT/plans.json" ;;
        nofuse-mnist-*) run "$step" 400 python3 benchmarks/bench_mnist.py --out "$OUT/bench/nofuse" --models "${step#nofuse-mnist-}" --skip-compile --skip-numpy --no-fuse ;;
        mnist-*)      run "$step" 400 python3 benchmarks/bench_mnist.py --out "$OUT/bench" --models "${step#mnist-}" --skip-compile --skip-numpy ;;
        profile)      run profile 200 python3 benchmarks/profile_host.py ;;
        probe-host)   run probe-host 200 python3 benchmarks/probe_host.py ;;
        probe-conv)   run probe-conv 200 python3 benchmarks/probe_conv_plan.py ;;
        probe-wgrad)  run probe-wgrad 120 python3 benchmarks/probe_conv_wgrad.py ;;
        probe-wgrad-before) PYTHONPATH=$PWD/.baseline run probe-wgrad-before 120 python3 benchmarks/probe_conv_wgrad.py ;;
        probe-conv-before) PYTHONPATH=$PWD/.baseline run probe-conv-before 200 python3 benchmarks/probe_conv_plan.py ;;
        port)         run port "${PORT_LIMIT:-420}" python3 scripts/compare_port.py --seeds 1 2 3 --epochs "${PORT_EPOCHS:-14}" --out "$OUT/bench/port.json" ;;
        cold-*)       rm -rf /root/.triton /root/.cache/tritonad; run "$step" 170 python3 -m tritonad train --model "${step#cold-}" --quiet ;;
        warm-*)       run "$step" 120 python3 -m tritonad train --model "${step#warm-}" --quiet ;;
        torch-*)      run "$step" 120 python3 benchmarks/torch_recipe.py --model "${step#torch-}" ;;
        host)         run host 300 python3 benchmarks/bench_host.py --out "$OUT/bench" --profile ;;
        host-again)   run host-again 300 python3 benchmarks/bench_host.py --out "$OUT/bench/again" ;;
        host-before-again) PYTHONPATH=$PWD/.baseline run host-before-again 300 python3 benchmarks/bench_host.py --out "$OUT/bench/before-again" ;;
        host-before)  PYTHONPATH=$PWD/.baseline run host-before 300 python3 benchmarks/bench_host.py --out "$OUT/bench/before" --profile ;;
        gpu-tests-checked) TRITONAD_CHECK_LAUNCHES=1 run gpu-tests-checked 500 python3 -m pytest -m gpu -q -p no:cacheprovider -n 8 --timeout 300 --durations=30 -x ;;
        profile-step) run profile-step 300 python3 benchmarks/profile_step.py ;;
        profile-step-plans) run profile-step-plans 400 python3 benchmarks/profile_step.py --plans ;;
        sweep-conv)   run sweep-conv 420 python3 benchmarks/sweep_conv.py --out "$OUT/bench" ;;
        sweep-mlp)    run sweep-mlp 300 python3 benchmarks/sweep_mlp.py ;;
        sweep-matmul) run sweep-matmul 420 python3 benchmarks/sweep_matmul.py --out "$OUT/bench" ;;
        gpt-steps=*)  run "$step" 200 python3 -m tritonad train --model gpt --steps "${step#gpt-steps=}" ;;
        resnet-nopdl-epochs=*) TRITONAD_PDL=0 run "$step" 200 python3 -m tritonad train --model resnet --dataset fashion-mnist --epochs "${step#resnet-nopdl-epochs=}" ;;
        resnet-epochs=*) run "$step" 200 python3 -m tritonad train --model resnet --dataset fashion-mnist --epochs "${step#resnet-epochs=}" ;;
        # (-v --tb=line --maxfail: each failure named as it happens, the summary printed before
        # the step's time limit cuts the log)
        tb-gpu)       run tb-gpu "${TB_LIMIT:-300}" python3 -m pytest -m gpu -v -p no:cacheprovider -n 8 --timeout 120 --tb=line --maxfail=25 -rf tests/test_torch_backend.py tests/test_torch_backend_nn.py tests/test_torch_backend_programs.py ;;
        recipe-table) run recipe-table 400 python3 scripts/make_plan_table.py --recipes --out "$OUT/recipes.json"
                      run recipe-table-add 30 python3 scripts/make_plan_table.py --add "$OUT/recipes.json" ;;
        tuned-matmul-*) TRITONAD_AUTOTUNE=1 TRITONAD_AUTOTUNE_DIR=$(mktemp -d) run "$step" 400 python3 -m tritonad bench matmul --out "$OUT/bench/tuned" --sections "${step#tuned-matmul-}" --precisions bf16,tf32 ;;
        torch-gpt-bf16) run torch-gpt-bf16 120 python3 benchmarks/torch_gpt.py --mode eager-bf16 --steps 300 --eval-every 100 --eval-batches 2 ;;
        torch-resnet-bf16) run torch-resnet-bf16 120 python3 benchmarks/torch_resnet.py --mode eager-bf16 --epochs 3 ;;
        cnn-epochs=*) run "$step" 100 python3 -m tritonad train --model cnn --epochs "${step#cnn-epochs=}" ;;
        profile-gpt2) run profile-gpt2 200 python3 benchmarks/profile_gpt.py ;;
        profile-gpt-nopdl) TRITONAD_PDL=0 run profile-gpt-nopdl 200 python3 benchmarks/profile_gpt.py --steps 200 --top 40 ;;
        gpu-tests-files=*) run gpu-tests-files "${GPU_FILES_LIMIT:-200}" python3 -m pytest -m gpu -q -p no:cacheprovider -n 8 --timeout 150 -x $(echo "${step#gpu-tests-files=}" | tr , ' ') ;;
        profile-gpt)  run profile-gpt 200 python3 benchmarks/profile_gpt.py ;;
        train-*)      run "$step" 300 python3 -m tritonad train --model "${step#train-}" --quiet --save "$OUT/bench/${step#train-}.tdckpt" ;;
        *) echo "unknown step $step" | tee -a "$OUT/summary.txt" ;;
    esac
done
tar czf "$OUT/logs.tgz" -C "$OUT" logs bench 2>/dev/null
rm -rf "$OUT/logs" "$OUT/bench"
caches=$(cd /root && ls -d .triton/cache .cache/tritonad 2>/dev/null)
tar czf "$OUT/cache.tgz" -C /root $caches 2>/dev/null
size=$(stat -c %s "$OUT/cache.tgz" 2>/dev/null || echo 0)
if [ "$size" -gt 15000000 ]; then  # too large to come back: the tuning cache alone, if any
    if [ -d /root/.cache/tritonad ]; then tar czf "$OUT/cache.tgz" -C /root .cache/tritonad; else rm -f "$OUT/cache.tgz"; fi
fi
echo "---- summary"; cat "$OUT/summary.txt"

#!/bin/bash
# Which training choices move the residual policy past its base, heft_history_srpt: each try
# trains with experiments/ppo_tries.py from the base (the same steady-state episodes, seed and
# budget of updates) and is evaluated on 3 held-out seeds x 200 workflows at loads 0.8 and
# 0.95. Two streams, one per core:
#   experiments/policy_study.sh A OUT   input-driven, all residuals; then the same run longer
#   experiments/policy_study.sh B OUT   critic/GAE; priority alone; reservations alone; KL budget
# Then: .venv/bin/python experiments/policy_study.py OUT
set -euo pipefail
stream=$1
out=$2
py=${PY:-.venv/bin/python}
updates=${UPDATES:-20}
mkdir -p "$out"
common=(--seed 1 --set episode_workflows=100 --set curriculum=false --set "load_range=[0.8,0.95]"
        --set update_epochs=4 --set minibatch_size=256 --set learning_rate=3e-4
        --eval-seeds 3 --eval-workflows 200)
run() {
    local label=$1
    shift
    echo "=== $label $(date -u +%H:%M:%S)"
    $py experiments/ppo_tries.py "${common[@]}" "$@" --label "$label" --out "$out" \
        > "$out/$label.log" 2>&1
    tail -4 "$out/$label.log"
}
if [ "$stream" = A ]; then
    run input_all --updates "$updates" --set advantage=input
    run input_all_long --updates $((3 * updates)) --set advantage=input --resume-from input_all
else
    run gae_all --updates "$updates" --set advantage=gae --set critic_warmup_updates=3 \
        --set rollout_steps=2048
    run input_priority --updates "$updates" --set advantage=input --set 'residuals=["priority"]'
    run input_reservations --updates "$updates" --set advantage=input \
        --set 'residuals=["cpu","mem"]'
    run input_kl --updates "$updates" --set advantage=input --set kl_coef=0.01 \
        --set kl_budget=1.0
fi

#!/usr/bin/env bash
# The runs behind docs/results/codasca_window_claim.md's "5 seeds", "two-stage recipe" and "I = 32"
# sections and the 2026-11-24 re-runs of docs/results/codasca_fmnist_ih.md (MLP and CNN) /
# codasca_more_orgs.md.
# One run at a time, niced (nice -n 10; NICE=5 bash scripts/codasca_seeds.sh ... for nice -n 5); every
# run uses the vectorised executor (same numbers as the sequential one to ~1e-7 AUROC, about 1.6x faster).
# Usage: bash scripts/codasca_seeds.sh [part ...] with parts: paired adam_pretrain protocol more_orgs
# paired01 i32 cnn_pre cnn_all (default: all, in that order);
# "cnn SETUP I" runs one CNN pair (SETUP in base pretrained imratio30 k16) with seed 0, or seed S with SEED=S.
set -u
F="nice -n ${NICE:-10} ${FEDRISK:-.venv/bin/fedrisk} run --quiet"
X="--set run.executor=vectorized"
R=runs/codasca_seeds
I256="--set algorithm.window=256 --set run.rounds=8 --set run.eval_every=1"
one() {  # one <out> <args...>: skip a finished run
    local out=$1; shift
    [ -f "$out/summary.json" ] && return 0
    local t0=$SECONDS
    $F "$@" $X --out "$out" 2>/dev/null || echo "FAILED $out"
    echo "$(date -u +%H:%M:%S) $out $((SECONDS - t0)) s"
}
paired() {  # I = 256 on the hard and skewed set-ups, CODA+ and CODASCA, the given seeds
    for s in "$@"; do for setup in hard skewed; do for alg in codaplus codasca; do
        cfg=configs/codasca/fmnist_ih_hard.toml; [ $setup = skewed ] && cfg=configs/codasca/fmnist_skewed.toml
        one $R/s$s/${setup}_${alg}_I256 $cfg --set algorithm.name=$alg $I256 --set run.seed=$s
    done; done; done
}
protocol() {  # the paper's protocol (lr 0.1, / 3 every T0 = 512, T = 2,048) with the MLP, I = 128
    for setup in base imratio30 k16; do for alg in codaplus codasca; do
        case $setup in
            base) extra=() ;;
            imratio30) extra=(--set data.binarize.imratio=0.3) ;;
            k16) extra=(--set data.num_clients=16 --set data.partition_options.subdivide=4) ;;
        esac
        one $R/protocol/${setup}_${alg}_I128 configs/codasca/fmnist_ih_hard.toml --set algorithm.name=$alg \
            --set algorithm.lr=0.1 --set algorithm.stage_iters=512 --set algorithm.window=128 \
            --set run.rounds=16 --set run.eval_every=2 "${extra[@]}"
    done; done
}
adam_pretrain() {  # the two-stage recipe with the paper's central Adam pre-training (MLP), seeds 0-2, and
    # the paper's Adam lr 1e-5 for comparison (stage 1 only)
    one $R/pretrain_central_adam configs/codasca/fmnist_ih_pretrain_central.toml
    one $R/pretrain_central_adam_lr1e-5 configs/codasca/fmnist_ih_pretrain_central.toml --set algorithm.server_lr=1e-5
    for s in 0 1 2; do for alg in codaplus codasca; do
        one $R/s$s/adam_pretrained_${alg}_I256 configs/codasca/fmnist_ih_hard.toml --set algorithm.name=$alg $I256 \
            --set run.seed=$s --set run.init_from=$R/pretrain_central_adam
    done; done
}
i32() {  # the hard set-up at I = 32 (64 rounds), seeds 0-4
    for s in 0 1 2 3 4; do for alg in codaplus codasca; do
        one $R/s$s/hard_${alg}_I32 configs/codasca/fmnist_ih_hard.toml --set algorithm.name=$alg \
            --set algorithm.window=32 --set run.rounds=64 --set run.eval_every=8 --set run.seed=$s
    done; done
}
C=runs/codasca_cnn
cnn() {  # the paper's protocol with the CNN (configs/codasca/fmnist_ih*.toml): cnn <set-up> <I>; seed $SEED (0)
    local setup=$1 I=$2 cfg=configs/codasca/fmnist_ih.toml extra=() seed=${SEED:-0}
    case $setup in
        imratio30) cfg=configs/codasca/fmnist_ih_imratio30.toml ;;
        k16) cfg=configs/codasca/fmnist_ih_k16.toml ;;
        pretrained) extra=(--set run.init_from=$C/pretrain_central_cnn) ;;
    esac
    for alg in codaplus codasca; do
        one $C/s$seed/${setup}_${alg}_I$I $cfg --set algorithm.name=$alg --set algorithm.window=$I \
            --set run.rounds=$((2048 / I)) --set run.eval_every=$((256 / I > 0 ? 256 / I : 1)) \
            --set run.seed=$seed "${extra[@]}"
    done
}
cnn_pre() {  # stage 1 of the two-stage recipe for the CNN: central Adam pre-training
    one $C/pretrain_central_cnn configs/codasca/fmnist_ih_pretrain_central_cnn.toml
}
cnn_all() {
    cnn base 32
    cnn base 128
    cnn_pre
    cnn pretrained 128
    cnn imratio30 128
    cnn k16 128
}
more_orgs() {
    [ -d runs/codasca_more_orgs_protocol ] || nice -n ${NICE:-10} ${FEDRISK:-.venv/bin/fedrisk} sweep \
        configs/codasca/more_orgs.toml --out runs/codasca_more_orgs_protocol 2>/dev/null
}
[ $# -eq 0 ] && set -- paired adam_pretrain protocol more_orgs paired01 i32 cnn_all
while [ $# -gt 0 ]; do
    case $1 in
        paired) paired 2 3 4 ;;
        paired01) paired 0 1 ;;
        cnn) cnn "$2" "$3"; shift 2 ;;
        *) $1 ;;
    esac
    shift
done

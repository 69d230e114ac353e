#!/bin/bash
# Llama 3 8B with 32K-token sequences on 64 H100s: TP 2 with sequence parallelism, context
# parallelism 4 (the ring: --cp-comm-type p2p), data parallel 8 with the distributed optimizer,
# as a Megatron-LM launch script passes it: scenarios/llama3-8b-h100x64-cp4-32k.yaml. Written for
# sim5d; Llama 3's 128,256 entries are already a multiple of 128 x TP 2.
#
#   sim5d import scenarios/launch/llama3-8b-h100x64-cp4-32k.sh --cluster dgx-h100-ndr:64
pretrain_gpt.py \
    --use-mcore-models \
    --num-layers 32 --hidden-size 4096 --ffn-hidden-size 14336 \
    --num-attention-heads 32 --group-query-attention --num-query-groups 8 --kv-channels 128 \
    --seq-length 32768 --max-position-embeddings 131072 \
    --position-embedding-type rope --rotary-base 500000 \
    --swiglu --normalization RMSNorm --disable-bias-linear --untie-embeddings-and-output-weights \
    --hidden-dropout 0.0 --attention-dropout 0.0 \
    --vocab-size 128256 \
    --tensor-model-parallel-size 2 --sequence-parallel \
    --context-parallel-size 4 --cp-comm-type p2p \
    --micro-batch-size 1 --global-batch-size 64 \
    --recompute-granularity selective --recompute-modules core_attn \
    --bf16 --grad-reduce-in-bf16 --use-distributed-optimizer --overlap-grad-reduce \
    --attention-backend flash \
    --lr 3.0e-4 --min-lr 3.0e-5 --lr-decay-style cosine --clip-grad 1.0 --weight-decay 0.1 \
    --tokenizer-type HuggingFaceTokenizer --tokenizer-model meta-llama/Meta-Llama-3-8B --mock-data

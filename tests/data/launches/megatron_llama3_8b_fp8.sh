#!/bin/bash
# Llama 3 8B in FP8 on two 8-GPU nodes, written as Megatron-LM's examples/llama launches are
# (expanded: no shell variables), for tests/test_frameworks.py.
torchrun --nproc_per_node 8 --nnodes 2 --node_rank 0 --master_addr localhost --master_port 29500 \
    pretrain_gpt.py \
    --use-mcore-models \
    --num-layers 32 --hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32 \
    --group-query-attention --num-query-groups 8 --kv-channels 128 \
    --seq-length 8192 --max-position-embeddings 8192 \
    --position-embedding-type rope --rotary-base 1000000 --rotary-percent 1.0 \
    --attention-dropout 0.0 --hidden-dropout 0.0 \
    --swiglu --normalization RMSNorm --init-method-std 0.0134 \
    --attention-backend fused \
    --untie-embeddings-and-output-weights --disable-bias-linear \
    --micro-batch-size 1 --global-batch-size 128 \
    --train-samples 1953125000 --lr 0.00015 --min-lr 0.00001 --lr-decay-style cosine \
    --clip-grad 1.0 --weight-decay 0.1 --adam-beta1 0.9 --adam-beta2 0.95 \
    --bf16 --grad-reduce-in-bf16 --cross-entropy-loss-fusion --manual-gc \
    --fp8-format hybrid --fp8-amax-history-len 1024 --fp8-amax-compute-algo max \
    --tensor-model-parallel-size 2 --context-parallel-size 1 --sequence-parallel \
    --use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather \
    --tokenizer-type HuggingFaceTokenizer --tokenizer-model meta-llama/Meta-Llama-3-8B \
    --vocab-size 128256 --mock-data   # a comment at the end of the line

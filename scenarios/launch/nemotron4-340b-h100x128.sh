#!/bin/bash
# Nemotron-4 340B on 128 H100s (16 DGX H100 nodes), the layout NVIDIA's NeMo recipe trains it with
# (TP 8, PP 8 with 12 virtual stages, selective recompute, TP communication overlap) as a
# Megatron-LM launch script passes it: scenarios/nemotron4-340b-h100x128.yaml. Written for sim5d.
# Squared ReLU, no biases, untied embeddings and RoPE as the technical report (arXiv 2406.11704)
# describes; the 256,000-entry vocabulary is already a multiple of 128 x TP 8.
#
#   sim5d import scenarios/launch/nemotron4-340b-h100x128.sh --cluster dgx-h100-ndr
torchrun --nnodes 16 --nproc-per-node 8 pretrain_gpt.py \
    --use-mcore-models --transformer-impl transformer_engine \
    --num-layers 96 --hidden-size 18432 --ffn-hidden-size 73728 \
    --num-attention-heads 96 --group-query-attention --num-query-groups 8 \
    --seq-length 4096 --max-position-embeddings 4096 \
    --position-embedding-type rope --rotary-percent 0.5 --rotary-base 10000 \
    --squared-relu --normalization LayerNorm --apply-layernorm-1p \
    --disable-bias-linear --untie-embeddings-and-output-weights \
    --hidden-dropout 0.0 --attention-dropout 0.0 \
    --vocab-size 256000 \
    --tensor-model-parallel-size 8 --pipeline-model-parallel-size 8 \
    --virtual-pipeline-model-parallel-size 12 --sequence-parallel --tp-comm-overlap \
    --micro-batch-size 1 --global-batch-size 32 \
    --recompute-granularity selective \
    --bf16 --grad-reduce-in-bf16 --use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather \
    --lr 1.0e-4 --min-lr 1.0e-5 --lr-decay-style cosine --weight-decay 0.1 --clip-grad 1.0 \
    --init-method-std 0.0063 --seed 1234 --mock-data \
    --tokenizer-type SentencePieceTokenizer --tokenizer-model /data/nemotron4/tokenizer.model \
    --log-interval 1 --log-throughput

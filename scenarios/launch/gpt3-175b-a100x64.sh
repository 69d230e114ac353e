#!/bin/bash
# GPT-3 175B on 64 A100s (8 DGX A100 nodes), as a Megatron-LM launch script passes it: the layout
# of scenarios/gpt3-175b-a100x64.yaml (TP 8, PP 8 with 3 virtual stages, selective recompute,
# the distributed optimizer with both overlaps). Written for sim5d; the GPT-2 tokenizer's 50,257
# entries are padded by Megatron-LM to a multiple of 128 x TP = 1,024: 51,200.
#
#   sim5d import scenarios/launch/gpt3-175b-a100x64.sh --cluster dgx-a100-hdr
torchrun --nnodes 8 --nproc-per-node 8 --node-rank 0 --master-addr localhost --master-port 6000 \
    pretrain_gpt.py \
    --num-layers 96 --hidden-size 12288 --num-attention-heads 96 \
    --seq-length 2048 --max-position-embeddings 2048 \
    --vocab-size 50257 \
    --tensor-model-parallel-size 8 --pipeline-model-parallel-size 8 \
    --num-layers-per-virtual-pipeline-stage 4 \
    --sequence-parallel \
    --micro-batch-size 1 --global-batch-size 64 \
    --recompute-activations \
    --bf16 --grad-reduce-in-bf16 \
    --use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather \
    --train-iters 500000 --lr 6.0e-5 --min-lr 6.0e-6 --lr-decay-style cosine --lr-warmup-iters 2000 \
    --weight-decay 0.1 --adam-beta1 0.9 --adam-beta2 0.95 --clip-grad 1.0 --init-method-std 0.006 \
    --data-path /data/gpt3/my-gpt3_00_text_document --split 949,50,1 \
    --vocab-file /data/gpt3/gpt2-vocab.json --merge-file /data/gpt3/gpt2-merges.txt \
    --log-interval 10 --eval-interval 1000 --eval-iters 10 \
    --save /checkpoints/gpt3-175b --save-interval 1000

# The block_m 128 tails of each model at M = 4096 under uniform top-k routing (the simulation of
# bench/results/2026-12-07-h100-tails.md, section 5): tails of at most 32 pairs, and their pairs.
import random
def sim(M,E,k,bm=128,seed=1):
    random.seed(seed); cnt=[0]*E
    for _ in range(M):
        for e in random.sample(range(E),k): cnt[e]+=1
    nt=0; tp=0; blocks=0
    for n in cnt:
        blocks += (n+bm-1)//bm
        r=n%bm
        if n>bm and 0<r<=32: nt+=1; tp+=r
    return nt, tp, blocks, M*k
for name,E,k in [("deepseek-v3",256,8),("gpt-oss-120b",128,4),("qwen3-235b-a22b",128,8),("qwen3-30b-a3b",128,8),("mixtral-8x7b",8,2),("kimi-k2",384,8)]:
    nt,tp,b,P=sim(4096,E,k)
    print(f"{name}: {nt} tails of <=32 pairs of {b} blocks, {tp} pairs = {100*tp/P:.1f} % of the {P} pairs")

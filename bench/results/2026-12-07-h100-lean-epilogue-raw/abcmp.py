#!/usr/bin/env python3
# usage: abcmp.py DIR  -- compares bench-ab-{base,new}{1,2}.csv and gemmab-{old,new}{1,2}.txt
import csv, sys, os, re, statistics
d = sys.argv[1]
def ab(pre, base, new):
    f = lambda s, r: os.path.join(d, f"{pre}{s}{r}.csv")
    if not os.path.exists(f(base, 1)): return
    tab = {}
    for s in (base, new):
        for r in (1, 2):
            if not os.path.exists(f(s, r)): continue
            for row in csv.DictReader(open(f(s, r))):
                tab.setdefault((row['preset'], int(row['M'])), {}).setdefault(s, []).append(float(row['time_us']))
    print(f"{'preset':18s} {'M':>5s} {'base':>18s} {'new':>18s} {'d%':>6s}")
    for k in sorted(tab):
        b, n = tab[k].get(base, []), tab[k].get(new, [])
        if not b or not n: continue
        mb, mn = min(b), min(n)
        print(f"{k[0]:18s} {k[1]:5d} {'/'.join(f'{x:.1f}' for x in b):>18s} {'/'.join(f'{x:.1f}' for x in n):>18s} {(mn/mb-1)*100:+6.1f}")
def gemm(fn):
    out = {}; model = None
    for l in open(fn):
        m = re.match(r'^(\S+) routed experts', l)
        if m: model = m.group(1)
        m = re.match(r'^\| (\d+) \| (\d+) \| (\d+) \| (\d+) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+)', l)
        if m and model: out[(model, int(m.group(1)))] = tuple(float(m.group(i)) for i in (5, 6, 7))
    return out
def gab(a, b):
    fa = [os.path.join(d, f"gemmab-{a}{r}.txt") for r in (1, 2)]
    fb = [os.path.join(d, f"gemmab-{b}{r}.txt") for r in (1, 2)]
    if not all(map(os.path.exists, fa + fb)): return
    A = [gemm(x) for x in fa]; B = [gemm(x) for x in fb]
    print(f"\nGEMMs alone: {a} vs {b} (G1 / G2 / total, µs; rounds 1/2; d% of min total)")
    for k in sorted(A[0]):
        ta = [x[k][2] for x in A if k in x]; tb = [x[k][2] for x in B if k in x]
        g2a = [x[k][1] for x in A if k in x]; g2b = [x[k][1] for x in B if k in x]
        g1a = [x[k][0] for x in A if k in x]; g1b = [x[k][0] for x in B if k in x]
        print(f"{k[0]:18s} {k[1]:5d} G1 {min(g1a):8.1f} -> {min(g1b):8.1f} ({(min(g1b)/min(g1a)-1)*100:+5.1f}%)  G2 {min(g2a):8.1f} -> {min(g2b):8.1f} ({(min(g2b)/min(g2a)-1)*100:+5.1f}%)  tot {'/'.join(f'{x:.0f}' for x in ta)} -> {'/'.join(f'{x:.0f}' for x in tb)} ({(min(tb)/min(ta)-1)*100:+5.1f}%)")
ab("bench-ab-", "base", "new")
gab("gpu_hopper_gemm_old", "gpu_hopper_gemm")

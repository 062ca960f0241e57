import csv, gzip, sys, collections
# usage: sass_page.py PAGE.csv.gz dump                  every SASS instruction: index, samples, times run, source, top 2 stalls
#        sass_page.py PAGE.csv.gz regions               samples by how often an instruction ran (one group per loop)
#        sass_page.py PAGE.csv.gz stalls LO HI [N]      stall reasons of instructions LO..HI, then the N most sampled
# PAGE: ncu --page source --print-source sass --csv (SourceCounters, WarpStateStats)
lines = gzip.open(sys.argv[1], 'rt').read().splitlines()
i = [k for k, l in enumerate(lines) if l.startswith('"Address","Source"')][0]
rows = list(csv.reader(lines[i:]))
h = rows[0]
rows = [r for r in rows[1:] if len(r) == len(h)]
ix = {n: k for k, n in enumerate(h)}
stalls = [n for n in h if n.startswith('stall_') and '(Not' not in n]
samples = lambda r: int(r[ix['Warp Stall Sampling (All Samples)']])
ran = lambda r: int(r[ix['Instructions Executed']] or 0)
top = lambda r, n: sorted(((int(r[ix[x]]), x[6:]) for x in stalls), reverse=True)[:n]
tot = sum(samples(r) for r in rows)
mode = sys.argv[2]
if mode == 'dump':
    print('instructions', len(rows), 'samples', tot)
    for n, r in enumerate(rows):
        t = top(r, 2)
        print(f'{n:5d} {samples(r):6d} {ran(r):10d} {r[ix["Source"]].strip()[:60]:60s} '
              f'{t[0][1]}:{t[0][0]} {t[1][1]}:{t[1][0]}')
elif mode == 'regions':
    g = collections.defaultdict(lambda: [0, 0, 9e9, 0])
    for n, r in enumerate(rows):
        a = g[ran(r)]
        a[0] += samples(r); a[1] += 1; a[2] = min(a[2], n); a[3] = max(a[3], n)
    print('total samples', tot)
    for ex, (s, c, lo, hi) in sorted(g.items(), key=lambda x: -x[1][0])[:25]:
        print(f'exec {ex:10d}: {c:5d} instrs [{lo}-{hi}] samples {s:7d} {100 * s / tot:5.1f}%')
elif mode == 'stalls':
    lo, hi = int(sys.argv[3]), int(sys.argv[4])
    acc = collections.Counter()
    sel = [(n, r) for n, r in enumerate(rows) if lo <= n <= hi]
    for n, r in sel:
        for x in stalls: acc[x[6:]] += int(r[ix[x]])
    st = sum(samples(r) for n, r in sel)
    print('samples', st)
    print(' '.join(f'{k}:{100 * v / st:.1f}%' for k, v in acc.most_common(10)))
    for n, r in sorted(sel, key=lambda x: (samples(x[1]), x[0]), reverse=True)[:int(sys.argv[5]) if len(sys.argv) > 5 else 15]:
        print(f'{n:6d} {samples(r):6d} {r[ix["Source"]].strip()[:70]:70s} {top(r, 3)}')

import csv,sys,glob,collections,statistics
# usage: abcmp.py DIR PREFIX: the whole layer, nvfp4moe bench files PREFIXbench-ab-{base,new}N.csv,
# per (preset, M) the rounds and the change of the median
d=sys.argv[1]; pre=sys.argv[2] if len(sys.argv)>2 else ''
def load(side):
    out=collections.defaultdict(list)
    for f in sorted(glob.glob(f'{d}/{pre}bench-ab-{side}[0-9].csv')):
        for r in csv.DictReader(open(f)):
            out[(r['preset'],int(r['M']))].append(float(r['time_us']))
    return out
b=load('base'); n=load('new')
for k in sorted(b):
    if k in n:
        mb=statistics.median(b[k]); mn=statistics.median(n[k])
        print(f'{k[0]:16s} {k[1]:5d} base {"/".join(f"{x:.0f}" for x in b[k]):>12s} new {"/".join(f"{x:.0f}" for x in n[k]):>12s} {100*(mn/mb-1):+.1f}%')

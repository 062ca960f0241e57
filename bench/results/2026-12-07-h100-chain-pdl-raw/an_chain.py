import csv,sys,glob,statistics,collections
d=sys.argv[1]
def layer(prefix):
    out=collections.defaultdict(list); fl={}
    for f in sorted(glob.glob(f'{d}/{prefix}-[0-9].csv')):
        for r in csv.DictReader(open(f)):
            k=(r['preset'],int(r['M'])); out[k].append(float(r['time_us']))
            for c in ('floor_us','nvfp4_floor_us'):
                if c in r and r[c]: fl[k]=float(r[c])
    return out,fl
a,fa=layer('chain0'); b,fb=layer('chain1'); c,fc=layer('chain2')
print('preset M | chain0 rounds | chain1 rounds (change) | chain1+route256 rounds (change) | % floor chain0/1/2')
med=lambda v: statistics.median(v) if v else float('nan')
for k in sorted(a):
    ma=med(a[k]); mb=med(b.get(k)); mc=med(c.get(k)); f=fa.get(k) or float('nan')
    r=lambda v: '/'.join(f'{x:.1f}' for x in (v or []))
    print(f"{k[0]:16s} {k[1]:5d} | {r(a[k])} | {r(b.get(k))} ({100*(mb/ma-1):+.1f}%) | {r(c.get(k))} ({100*(mc/ma-1):+.1f}%) | {100*f/ma:.1f}/{100*f/mb:.1f}/{100*f/mc:.1f}")

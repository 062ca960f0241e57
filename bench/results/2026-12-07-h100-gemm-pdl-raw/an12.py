import csv,sys,glob,re,statistics,collections
d=sys.argv[1]
def layer(prefix):
    out=collections.defaultdict(list)
    for f in sorted(glob.glob(f'{d}/{prefix}-[0-9].csv')):
        for r in csv.DictReader(open(f)):
            out[(r['preset'],int(r['M']))].append(float(r['time_us']))
    return out
def cmp_layers(title, names):
    print('##',title)
    data={n:layer(n) for n in names}
    base=data[names[0]]
    for k in sorted(base):
        mb=statistics.median(base[k])
        row=[]
        for n in names:
            v=data[n].get(k)
            if not v: row.append('-'); continue
            m=statistics.median(v)
            row.append(f'{"/".join(f"{x:.1f}" for x in v)} ({100*(m/mb-1):+.1f}%)')
        print(f'{k[0]:16s} {k[1]:5d} | '+' | '.join(row))
def gemm(f):
    out={}; model=None
    for l in open(f):
        m=re.match(r'^(\S+) routed experts',l)
        if m: model=m.group(1); continue
        if l.startswith('| ') and model and not l.startswith('| M'):
            c=[x.strip() for x in l.strip().strip('|').split('|')]
            try: out[(model,int(c[0]))]=(float(c[4]),float(c[5]),float(c[6]))
            except: pass
    return out
def cmp_gemm(title, names):
    print('##',title)
    data={n:[gemm(f) for f in sorted(glob.glob(f'{d}/{n}-[0-9].txt'))] for n in names}
    base=data[names[0]]
    if not base: return
    for k in sorted(base[0]):
        b=min(r[k][2] for r in base if k in r)
        row=[]
        for n in names:
            vals=[r[k] for r in data[n] if k in r]
            if not vals: row.append('-'); continue
            g1=min(v[0] for v in vals); g2=min(v[1] for v in vals); t=min(v[2] for v in vals)
            row.append(f'{g1:.1f}/{g2:.1f}/{t:.1f} ({100*(t/b-1):+.1f}%)')
        print(f'{k[0]:16s} {k[1]:5d} | '+' | '.join(row))
cmp_layers('G1 prefetch of GEMM2 weights, MB 0 / 16', ["g1pf0","g1pf16"])
cmp_layers('GEMM regime: GEMM2 with PDL, 0 / 1', ['gpdl0','gpdl1'])
cmp_layers('combine: slots 4 at a time (default) / one at a time (c0)', ['gpdl0','comb0'])
cmp_gemm('GEMM WPF default / p4 (G1/G2/total, min of rounds)', ["gemmab","gemmab_p4"])
cmp_layers('layer WPF default / p4', ["layer","layer_p4"])
cmp_gemm('block_m 32 row tiles 2 / 1', ['gemmrt2','gemmrt1'])
cmp_layers('layer row tiles auto / 1', ['layerrt0','layerrt1'])

import sys,re,glob,os,collections
# usage: gemmcmp.py DIR PREFIX '' _v1 _v2 ... (PREFIX: call1-, call2-): the GEMMs alone (gpu_hopper_gemm --bench files *gemmab-gpu_hopper_gemm<v><round>.txt), min over rounds, total vs the first
d=sys.argv[1]; pre=sys.argv[2]; names=sys.argv[3:]
def parse(f):
    out={}; model=None
    for l in open(f):
        m=re.match(r'^(\S+) routed experts',l)
        if m: model=m.group(1); continue
        if l.startswith('| ') and model and not l.startswith('| M') :
            c=[x.strip() for x in l.strip().strip('|').split('|')]
            try: out[(model,int(c[0]))]=(float(c[4]),float(c[5]),float(c[6]))
            except: pass
    return out
data={}
for n in names:
    fs=sorted(glob.glob(f'{d}/{pre}gemmab-gpu_hopper_gemm{n}[0-9].txt'))
    rs=[parse(f) for f in fs]
    data[n]=rs
base=names[0]
keys=sorted(data[base][0].keys())
print('model M | '+' | '.join(f'{n or "base"} G1/G2/tot (rounds)' for n in names))
for k in keys:
    row=[]
    b=min(r[k][2] for r in data[base] if k in r)
    for n in names:
        vals=[r[k] for r in data[n] if k in r]
        if not vals: row.append('-'); continue
        g1=min(v[0] for v in vals); g2=min(v[1] for v in vals); t=min(v[2] for v in vals)
        row.append(f'{g1:.0f}/{g2:.0f}/{t:.0f} ({"/".join(f"{v[2]:.0f}" for v in vals)}) {100*(t/b-1):+.1f}%')
    print(k[0],k[1],'|',' | '.join(row))

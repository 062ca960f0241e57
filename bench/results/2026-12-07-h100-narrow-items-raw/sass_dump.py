import csv,gzip,sys,collections
f=sys.argv[1]
lines=gzip.open(f,'rt').read().splitlines()
i=[k for k,l in enumerate(lines) if l.startswith('"Address","Source"')][0]
rows=list(csv.reader(lines[i:]))
h=rows[0]; rows=[r for r in rows[1:] if len(r)==len(h)]
ix={n:k for k,n in enumerate(h)}
stalls=[n for n in h if n.startswith('stall_') and '(Not' not in n]
tot=sum(int(r[ix['Warp Stall Sampling (All Samples)']]) for r in rows)
print('instructions',len(rows),'samples',tot)
out=[]
for n,r in enumerate(rows):
    s=int(r[ix['Warp Stall Sampling (All Samples)']]); ex=int(r[ix['Instructions Executed']] or 0)
    src=r[ix['Source']].strip()
    top=sorted(((int(r[ix[x]]),x[6:]) for x in stalls),reverse=True)[:2]
    out.append((n,s,ex,src,top))
mode=sys.argv[2] if len(sys.argv)>2 else 'dump'
if mode=='dump':
    for n,s,ex,src,top in out:
        print(f'{n:5d} {s:6d} {ex:10d} {src[:60]:60s} {top[0][1]}:{top[0][0]} {top[1][1]}:{top[1][0]}')

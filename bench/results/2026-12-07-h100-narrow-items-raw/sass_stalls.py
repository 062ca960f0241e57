import csv,gzip,sys,collections
f=sys.argv[1]; lo=int(sys.argv[2]); hi=int(sys.argv[3])
lines=gzip.open(f,'rt').read().splitlines()
i=[k for k,l in enumerate(lines) if l.startswith('"Address","Source"')][0]
rows=list(csv.reader(lines[i:]))
h=rows[0]; rows=[r for r in rows[1:] if len(r)==len(h)]
ix={n:k for k,n in enumerate(h)}
stalls=[n for n in h if n.startswith('stall_') and '(Not' not in n]
acc=collections.Counter(); tot=0
top=[]
for n,r in enumerate(rows):
    if lo<=n<=hi:
        for x in stalls: acc[x[6:]]+=int(r[ix[x]])
        s=int(r[ix['Warp Stall Sampling (All Samples)']]); tot+=s
        top.append((s,n,r[ix['Source']].strip()[:70], sorted(((int(r[ix[x]]),x[6:]) for x in stalls),reverse=True)[:3]))
print('samples',tot)
print(' '.join(f'{k}:{100*v/tot:.1f}%' for k,v in acc.most_common(10)))
for s,n,src,t in sorted(top,reverse=True)[:int(sys.argv[4]) if len(sys.argv)>4 else 15]:
    print(f'{n:6d} {s:6d} {src:70s} {t}')

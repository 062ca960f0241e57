import sys,collections
rows=[]
for l in open(sys.argv[1]):
    p=l.split()
    if len(p)<4 or not p[0].isdigit(): continue
    rows.append((int(p[0]),int(p[1]),int(p[2]),p[3],l))
tot=sum(r[1] for r in rows)
# group by executed count
g=collections.defaultdict(lambda:[0,0,9e9,0])
for n,s,ex,op,l in rows:
    a=g[ex]; a[0]+=s; a[1]+=1; a[2]=min(a[2],n); a[3]=max(a[3],n)
print('total samples',tot)
for ex,(s,c,lo,hi) in sorted(g.items(),key=lambda x:-x[1][0])[:25]:
    print(f'exec {ex:10d}: {c:5d} instrs [{lo}-{hi}] samples {s:7d} {100*s/tot:5.1f}%')

import json,statistics,sys
pool={}
for d in sys.argv[1:]:
    s=json.load(open(d+'/summary.json'))
    per={}
    for r in s['systems']:
        per.setdefault(r['name'],[]).append(r['p99_us']/1000)
        pool.setdefault(r['name'],[]).append(r['p99_us']/1000)
    m={k:statistics.median(v) for k,v in per.items()}
    print(d, {k:round(v,2) for k,v in m.items()}, round(m['paio-adaptive']/m['paio-static'],2))
m={k:statistics.median(v) for k,v in pool.items()}
print('pooled', {k:(round(v,2),len(pool[k])) for k,v in m.items()}, round(m['paio-adaptive']/m['paio-static'],2))

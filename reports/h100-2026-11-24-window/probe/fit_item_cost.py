# Fits time = list-schedule(items) of (tiles x t + X) to the window sweep (tune-windows/results.csv, copied in by hand below):
# t = one KV tile, X = what an item pays besides its tiles. Run: python3 fit_item_cost.py
import heapq, itertools
def items(n_q, W, bkv, tok=32, heads=2):
    out=[]
    nqt=(n_q+tok-1)//tok
    for qt in reversed(range(nqt)):   # launched last first
        for h in range(heads):
            t0=qt*tok; p_hi=min(t0+tok,n_q)-1
            k_lo=max(0,t0-W+1) if W else 0
            out.append(p_hi//bkv - k_lo//bkv + 1)
    return out
def sim(its, t, X, sms=132):
    heap=[0.0]*sms
    for w in its:
        s=heapq.heappop(heap); heapq.heappush(heap, s+w*t+X)
    return max(heap)
data={'w0':(4096,0),'w256':(4096,256),'w512':(4096,512),'w1024':(4096,1024),'w2048':(4096,2048),'n2048':(2048,512),'n8192':(8192,512)}
import sys
meas={
 'win64':{'w0':158.671,'w256':51.688,'w512':67.624,'w1024':98.44,'w2048':157.392,'n2048':31.728,'n8192':127.888},
 'per32':{'w0':209.855,'w256':58.784,'w512':78.112,'w1024':126.304,'w2048':215.104,'n2048':37.605,'n8192':147.743},
 'win32':{'w0':195.071,'w256':54.456,'w512':74.744,'w1024':116.656,'w2048':196.56,'n2048':36.453,'n8192':145.68},
}
for name,bkv in [('win64',64),('win32',32),('per32',32)]:
    best=None
    for t in [x/1000 for x in range(500,3000,10)]:
        for X in [x/10 for x in range(0,300,2)]:
            err=sum((sim(items(*data[k],bkv),t,X)-v)**2/v**2 for k,v in meas[name].items())
            if best is None or err<best[0]: best=(err,t,X)
    err,t,X=best
    print(name,'t/tile=%.3f X/item=%.1f rms=%.3f'%(t,X,(err/7)**.5))
    for k,v in meas[name].items():
        print('   ',k,v,'%.1f'%sim(items(*data[k],bkv),t,X))

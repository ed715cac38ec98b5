import sys
f=sys.argv[1]+'/kernels/sm90/bwd_kernel.cuh';s=open(f).read()
s=s.replace('    if constexpr (kPrev) {','    if constexpr (false && kPrev) {')
s=s.replace('  if (n_iter > 0) {\n    float dq[32];','  if (false) {\n    float dq[32];')
o='bwd90_issue_dv_dk<T>(dv, dk, ap, as, do_buf, q_buf);\n    wgmma_wait<0>();'
assert o in s
s=s.replace(o,'''const SmemTileDesc od(do_buf,BM*128,1024),qd(q_buf,BM*128,1024);
    wgmma_fence();for(int k=0;k<BM/16;++k)wgmma_rs_tb_d<D>(dv,ap[k],od.at(k*2048));wgmma_commit();
    mbar_wait(ds_bar(b,wg),(it>>1)&1);float q2[32];for(int i=0;i<32;++i)q2[i]=0.f;wgmma_fence();
    bwd90_issue_dq<T>(q2,ds_addr,k_addr,dq_k_atom,dq_ds_atom,dq_key_step0,it);wgmma_wait<1>();fence_registers(dv);
    wgmma_fence();for(int k=0;k<BM/16;++k)wgmma_rs_tb_d<D>(dk,as[k],qd.at(k*2048));wgmma_commit();
    wgmma_wait<1>();fence_registers(q2);bwd90_store_dq<T>(q2,dq_addr,it,cwarp,wg,g,t);wgmma_wait<0>();''')
open(f,'w').write(s)

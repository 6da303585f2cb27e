// rustccl device code: loads and stores of FIFO slots (volatile: written by peers) and of user
// memory (any alignment). Included by exec.cu after the ABI header.
#ifndef RUSTCCL_MEMORY_H
#define RUSTCCL_MEMORY_H

#if RUSTCCL_HIP
// HIP: volatile accesses (the compiler emits coherent, uncached-at-the-CU loads and stores for
// them); 16 bytes as one vector access, as the PTX versions below. Compiled for gfx90a in CI;
// not run on an AMD GPU yet.
typedef unsigned long long rustccl_u64x2 __attribute__((ext_vector_type(2)));
typedef unsigned int rustccl_u32x4 __attribute__((ext_vector_type(4)));
RUSTCCL_DEVICE u64 ld_volatile_u64(u64 addr) { return *(const volatile u64*)addr; }
RUSTCCL_DEVICE u32 ld_volatile_u32(u64 addr) { return *(const volatile u32*)addr; }
RUSTCCL_DEVICE void st_volatile_u64(u64 addr, u64 v) { *(volatile u64*)addr = v; }
// 16 bytes of user memory, aligned to 16, as two words.
RUSTCCL_DEVICE void ld_global_v2(const unsigned char* p, u64& x, u64& y) {
  const rustccl_u64x2 c = *(const rustccl_u64x2*)p;
  x = c.x;
  y = c.y;
}
RUSTCCL_DEVICE void ld_volatile_v2(u64 addr, u64& x, u64& y) {
  const rustccl_u64x2 c = *(const volatile rustccl_u64x2*)addr;
  x = c.x;
  y = c.y;
}
RUSTCCL_DEVICE void st_volatile_v2(u64 addr, u64 x, u64 y) {
  rustccl_u64x2 c;
  c.x = x;
  c.y = y;
  *(volatile rustccl_u64x2*)addr = c;
}
RUSTCCL_DEVICE void ld_volatile_v4(u64 addr, u32& a, u32& b, u32& c, u32& d) {
  const rustccl_u32x4 v = *(const volatile rustccl_u32x4*)addr;
  a = v.x;
  b = v.y;
  c = v.z;
  d = v.w;
}
RUSTCCL_DEVICE void st_volatile_v4(u64 addr, u32 a, u32 b, u32 c, u32 d) {
  rustccl_u32x4 v;
  v.x = a;
  v.y = b;
  v.z = c;
  v.w = d;
  *(volatile rustccl_u32x4*)addr = v;
}
#else
RUSTCCL_DEVICE u64 ld_volatile_u64(u64 addr) {
  u64 v;
  asm volatile("ld.volatile.global.u64 %0, [%1];" : "=l"(v) : "l"(addr) : "memory");
  return v;
}
RUSTCCL_DEVICE u32 ld_volatile_u32(u64 addr) {
  u32 v;
  asm volatile("ld.volatile.global.u32 %0, [%1];" : "=r"(v) : "l"(addr) : "memory");
  return v;
}
RUSTCCL_DEVICE void st_volatile_u64(u64 addr, u64 v) {
  asm volatile("st.volatile.global.u64 [%0], %1;" ::"l"(addr), "l"(v) : "memory");
}
// 16 bytes of user memory, aligned to 16, as two words.
RUSTCCL_DEVICE void ld_global_v2(const unsigned char* p, u64& x, u64& y) {
  const ulonglong2 c = *(const ulonglong2*)p;
  x = c.x;
  y = c.y;
}
RUSTCCL_DEVICE void ld_volatile_v2(u64 addr, u64& x, u64& y) {
  asm volatile("ld.volatile.global.v2.u64 {%0,%1}, [%2];" : "=l"(x), "=l"(y) : "l"(addr) : "memory");
}
RUSTCCL_DEVICE void st_volatile_v2(u64 addr, u64 x, u64 y) {
  asm volatile("st.volatile.global.v2.u64 [%0], {%1,%2};" ::"l"(addr), "l"(x), "l"(y) : "memory");
}
RUSTCCL_DEVICE void ld_volatile_v4(u64 addr, u32& a, u32& b, u32& c, u32& d) {
  asm volatile("ld.volatile.global.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(a), "=r"(b), "=r"(c), "=r"(d)
               : "l"(addr)
               : "memory");
}
RUSTCCL_DEVICE void st_volatile_v4(u64 addr, u32 a, u32 b, u32 c, u32 d) {
  asm volatile("st.volatile.global.v4.u32 [%0], {%1,%2,%3,%4};" ::"l"(addr), "r"(a), "r"(b), "r"(c), "r"(d)
               : "memory");
}

#endif

// A word of user memory: `valid` (1..8) bytes at any alignment; the rest reads as zero.
RUSTCCL_DEVICE u64 load_user_slow(const unsigned char* p, u32 valid) {
  if (valid == 8 && ((u64)p & 3) == 0) return (u64)((const u32*)p)[0] | ((u64)((const u32*)p)[1] << 32);
  u64 v = 0;
  for (u32 i = 0; i < valid; ++i) v |= (u64)p[i] << (8 * i);
  return v;
}
RUSTCCL_DEVICE u64 load_user(const unsigned char* p, u32 valid) {
  if (valid == 8 && ((u64)p & 7) == 0) return *(const u64*)p;
  return load_user_slow(p, valid);
}
RUSTCCL_DEVICE void store_user_slow(unsigned char* p, u64 v, u32 valid) {
  if (valid == 8 && ((u64)p & 3) == 0) {
    ((u32*)p)[0] = (u32)v;
    ((u32*)p)[1] = (u32)(v >> 32);
    return;
  }
  for (u32 i = 0; i < valid; ++i) p[i] = (unsigned char)(v >> (8 * i));
}
RUSTCCL_DEVICE void store_user(unsigned char* p, u64 v, u32 valid) {
  if (valid == 8 && ((u64)p & 7) == 0) {
    *(u64*)p = v;
    return;
  }
  store_user_slow(p, v, valid);
}

#endif  // RUSTCCL_MEMORY_H

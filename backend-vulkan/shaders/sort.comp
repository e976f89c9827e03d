// argsort (pu(0) = 0 ascending, 1 descending) and top_k (descending, first ne0 of slot 0), one
// workgroup per row: a bitonic sort of (value, index) pairs in shared memory, rows of at most
// MAX_SORT elements. Ties keep the lower index first (a stable order); NaN sorts above every number.

#include "common.glsl"

#define MAX_SORT 1024u
shared float sv[MAX_SORT];
shared uint si[MAX_SORT];

int cmpf(float a, float b) {
    bool na = isnan(a), nbn = isnan(b);
    if (na && nbn) return 0;
    if (na) return 1;
    if (nbn) return -1;
    return a < b ? -1 : (a > b ? 1 : 0);
}

// True when element (va, ia) goes before (vb, ib); padding (index >= n) goes last.
bool before(float va, uint ia, float vb, uint ib, uint n, bool desc) {
    if (ia >= n) return false;
    if (ib >= n) return true;
    int c = desc ? cmpf(vb, va) : cmpf(va, vb);
    return c < 0 || (c == 0 && ia < ib);
}

void main() {
    uint r = group_id();
    if (r >= nrows(1u)) return;
    uvec3 ri = unravel_row(r, 1u);
    uint n = ne(1u, 0u);
    uint padded = 1u;
    while (padded < n) padded <<= 1;
    bool desc = pu(0u) == 1u;
    uint l = gl_LocalInvocationID.x;
    uint src = row_off(1u, ri.x, ri.y, ri.z);
    for (uint i = l; i < padded; i += WG) {
        sv[i] = i < n ? load_row_elem(1u, src, i) : 0.0;
        si[i] = i;
    }
    barrier();
    for (uint size = 2u; size <= padded; size <<= 1) {
        for (uint stride = size >> 1; stride > 0u; stride >>= 1) {
            for (uint t = l; t < padded / 2u; t += WG) {
                uint a = 2u * stride * (t / stride) + t % stride;
                uint b = a + stride;
                bool up = (a & size) == 0u;
                if (before(sv[b], si[b], sv[a], si[a], n, desc) == up) {
                    float tv = sv[a]; sv[a] = sv[b]; sv[b] = tv;
                    uint ti = si[a]; si[a] = si[b]; si[b] = ti;
                }
            }
            barrier();
        }
    }
    uint dst = row_off(0u, ri.x, ri.y, ri.z);
    for (uint i = l; i < ne(0u, 0u); i += WG) st32(0u, dst + i * nb(0u, 0u), si[i]);
}

// get_rows, one invocation per destination element: slot 1 = table (any loadable type; I32 tables
// copy bits into an I32 result), slot 2 = I32 row ids [n, ne2, ne3].

#define BLOCKS
#include "common.glsl"
#include "blocks.glsl"

void main() {
    uint e = thread_id();
    if (e >= nelem(0u)) return;
    uvec4 i = unravel(e, 0u);
    int row = load_i32(2u, uvec4(i.y, i.z, i.w, 0u));
    if (row < 0 || uint(row) >= ne(1u, 1u)) return;
    uvec4 si = uvec4(i.x, uint(row), i.z, i.w);
    if (ttype(1u) == ttype(0u)) {
        copy_raw(0u, elem_off(0u, i), 1u, elem_off(1u, si));
        return;
    }
    store(0u, i, load(1u, si));
}

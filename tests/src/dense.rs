//! `Dense`: a plain float64 tensor in ggml order (`ne[0]` innermost), the value type of the reference,
//! with the layout transforms the suite applies to inputs (permute, transpose, slices along axis 0).

/// A dense float64 tensor with ggml's 4-D shape; element (i0, i1, i2, i3) sits at
/// `i0 + ne0 * (i1 + ne1 * (i2 + ne2 * i3))`.
#[derive(Clone, Debug, PartialEq)]
pub struct Dense {
    pub ne: [usize; 4],
    pub data: Vec<f64>,
}

impl Dense {
    pub fn zeros(ne: [usize; 4]) -> Dense {
        Dense {
            ne,
            data: vec![0.0; ne.iter().product()],
        }
    }

    pub fn from_vec(ne: [usize; 4], data: Vec<f64>) -> Dense {
        assert_eq!(
            data.len(),
            ne.iter().product::<usize>(),
            "data length does not match {ne:?}"
        );
        Dense { ne, data }
    }

    pub fn len(&self) -> usize {
        self.data.len()
    }

    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    #[inline]
    pub fn idx(&self, i: [usize; 4]) -> usize {
        i[0] + self.ne[0] * (i[1] + self.ne[1] * (i[2] + self.ne[2] * i[3]))
    }

    #[inline]
    pub fn at(&self, i: [usize; 4]) -> f64 {
        self.data[self.idx(i)]
    }

    #[inline]
    pub fn set(&mut self, i: [usize; 4], v: f64) {
        let k = self.idx(i);
        self.data[k] = v;
    }

    /// Element `i` as an index (for I32 tensors holding ids or positions).
    pub fn id(&self, i: [usize; 4]) -> usize {
        let v = self.at(i);
        assert!(v >= 0.0 && v.fract() == 0.0, "{v} is not an index");
        v as usize
    }

    /// Row (i1, i2, i3) along axis 0.
    pub fn row(&self, i1: usize, i2: usize, i3: usize) -> &[f64] {
        let s = self.idx([0, i1, i2, i3]);
        &self.data[s..s + self.ne[0]]
    }

    pub fn row_mut(&mut self, i1: usize, i2: usize, i3: usize) -> &mut [f64] {
        let s = self.idx([0, i1, i2, i3]);
        let n = self.ne[0];
        &mut self.data[s..s + n]
    }

    /// Number of rows (`ne1 * ne2 * ne3`).
    pub fn nrows(&self) -> usize {
        self.ne[1] * self.ne[2] * self.ne[3]
    }

    /// Calls `f` with every index, `i0` fastest.
    pub fn for_each_index(ne: [usize; 4], mut f: impl FnMut([usize; 4])) {
        for i3 in 0..ne[3] {
            for i2 in 0..ne[2] {
                for i1 in 0..ne[1] {
                    for i0 in 0..ne[0] {
                        f([i0, i1, i2, i3]);
                    }
                }
            }
        }
    }

    /// A tensor of shape `ne` whose element `i` is `f(i)`.
    pub fn from_fn(ne: [usize; 4], mut f: impl FnMut([usize; 4]) -> f64) -> Dense {
        let mut data = Vec::with_capacity(ne.iter().product());
        Dense::for_each_index(ne, |i| data.push(f(i)));
        Dense { ne, data }
    }

    pub fn map(&self, f: impl Fn(f64) -> f64) -> Dense {
        Dense {
            ne: self.ne,
            data: self.data.iter().map(|&x| f(x)).collect(),
        }
    }

    /// ggml's permute: axis `k` of `self` becomes axis `axes[k]` of the result.
    pub fn permute(&self, axes: [usize; 4]) -> Dense {
        let mut ne = [0; 4];
        for k in 0..4 {
            ne[axes[k]] = self.ne[k];
        }
        Dense::from_fn(ne, |j| {
            self.at([j[axes[0]], j[axes[1]], j[axes[2]], j[axes[3]]])
        })
    }

    /// Swaps axes 0 and 1.
    pub fn transpose(&self) -> Dense {
        self.permute([1, 0, 2, 3])
    }

    /// Elements `offset .. offset + n` along `dim`.
    pub fn slice(&self, dim: usize, offset: usize, n: usize) -> Dense {
        assert!(
            offset + n <= self.ne[dim],
            "slice {offset}+{n} of {} on axis {dim}",
            self.ne[dim]
        );
        let mut ne = self.ne;
        ne[dim] = n;
        Dense::from_fn(ne, |mut i| {
            i[dim] += offset;
            self.at(i)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permute_follows_ggml_axis_mapping() {
        let a = Dense::from_fn([2, 3, 4, 1], |i| (i[0] + 10 * i[1] + 100 * i[2]) as f64);
        let p = a.permute([2, 0, 1, 3]);
        assert_eq!(p.ne, [3, 4, 2, 1]);
        assert_eq!(p.at([2, 3, 1, 0]), a.at([1, 2, 3, 0]));
        assert_eq!(a.transpose().transpose(), a);
        assert_eq!(a.slice(1, 1, 2).at([1, 0, 3, 0]), a.at([1, 1, 3, 0]));
    }
}

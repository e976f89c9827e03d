//! Typed access to the `<prefix>.<key>` metadata of a GGUF file, with errors that name the key; every
//! integer is read against its [`Bound`].

use super::limits::Bound;
use crate::error::ModelError;
use ggml_core::gguf::{Array, GgufFile, Value};

/// Typed access to `<arch>.<key>` metadata with errors that name the key.
pub struct Meta<'a> {
    pub file: &'a GgufFile,
    pub prefix: &'static str,
}

impl Meta<'_> {
    /// The full name of key `k`.
    pub fn key(&self, k: &str) -> String {
        format!("{}.{k}", self.prefix)
    }

    /// A required integer in `bound`.
    pub fn count(&self, k: &str, bound: Bound) -> Result<usize, ModelError> {
        self.opt_count(k, bound)?
            .ok_or_else(|| ModelError::MissingKey(self.key(k)))
    }

    /// An optional integer in `bound`.
    pub fn opt_count(&self, k: &str, bound: Bound) -> Result<Option<usize>, ModelError> {
        let key = self.key(k);
        let Some(v) = self.file.get(&key) else {
            return Ok(None);
        };
        match v.as_int::<u128>() {
            Some(x) => bound.check_wide(&key, x).map(Some),
            None => Err(ModelError::BadKey {
                key,
                msg: format!("expected a non-negative integer, found {}", v.describe()),
            }),
        }
    }

    /// An optional float.
    pub fn opt_f32(&self, k: &str) -> Result<Option<f32>, ModelError> {
        let key = self.key(k);
        match self.file.get(&key) {
            None => Ok(None),
            Some(v) => v.as_f32().map(Some).ok_or(ModelError::BadKey {
                key,
                msg: format!("expected a float, found {}", v.describe()),
            }),
        }
    }

    /// A required float.
    pub fn f32(&self, k: &str) -> Result<f32, ModelError> {
        self.opt_f32(k)?
            .ok_or_else(|| ModelError::MissingKey(self.key(k)))
    }

    /// An optional array of integers.
    pub fn opt_ints(&self, k: &str) -> Result<Option<Vec<i64>>, ModelError> {
        let key = self.key(k);
        match self.file.get(&key) {
            None => Ok(None),
            Some(v) => v
                .as_array()
                .and_then(|a| a.to_ints())
                .map(Some)
                .ok_or(ModelError::BadKey {
                    key,
                    msg: format!("expected an array of integers, found {}", v.describe()),
                }),
        }
    }

    /// An optional string.
    pub fn opt_str(&self, k: &str) -> Option<&str> {
        self.file.get(&self.key(k)).and_then(|v| v.as_str())
    }

    /// An optional per-layer integer in `bound`: one integer for every layer, or an array of
    /// `n_layer` integers.
    pub fn opt_per_layer(
        &self,
        k: &str,
        n_layer: usize,
        bound: Bound,
    ) -> Result<Option<Vec<usize>>, ModelError> {
        let key = self.key(k);
        let Some(v) = self.file.get(&key) else {
            return Ok(None);
        };
        let Value::Array(a) = v else {
            return Ok(self.opt_count(k, bound)?.map(|x| vec![x; n_layer]));
        };
        let values = a.to_ints::<u128>().filter(|x| x.len() == n_layer);
        let values = values.ok_or_else(|| ModelError::BadKey {
            key: key.clone(),
            msg: format!(
                "expected an integer or {n_layer} non-negative integers, found {}",
                v.describe()
            ),
        })?;
        let values = values.into_iter().map(|x| bound.check_wide(&key, x));
        values.collect::<Result<_, _>>().map(Some)
    }

    /// An optional array of `n_layer` booleans.
    pub fn opt_flags(&self, k: &str, n_layer: usize) -> Result<Option<Vec<bool>>, ModelError> {
        let key = self.key(k);
        match self.file.get(&key) {
            None => Ok(None),
            Some(Value::Array(Array::Bool(v))) if v.len() == n_layer => Ok(Some(v.clone())),
            Some(v) => Err(ModelError::BadKey {
                key,
                msg: format!("expected {n_layer} booleans, found {}", v.describe()),
            }),
        }
    }
}

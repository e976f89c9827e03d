//! Matrix multiplication kernels: `mul_mat` and `mul_mat_id` for float and quantized weights.

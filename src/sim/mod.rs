//! A simulator of PyTorch's CUDA caching allocator (workshops, demos, and
//! what-if replays of allocation traces).
//!
//! - [`rules`]: the allocator's size rules as pure functions (shared with the model).
//! - [`conf`]: `PYTORCH_CUDA_ALLOC_CONF` parsing.
pub mod conf;
pub mod rules;

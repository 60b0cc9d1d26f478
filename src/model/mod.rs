pub mod device;
pub mod rules;
pub mod series;

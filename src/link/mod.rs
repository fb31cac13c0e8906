//! The link: the α–β model of an all-reduce fitted to a sweep ([`model`]), links by
//! specification ([`spec`]), and the file a sweep writes them to (`link_model.json`).
//! What `reduce` projects with and `allreduce` fits; it uses neither libtorch nor MPI.

mod file;
pub(crate) mod model;
pub(crate) mod spec;

pub use file::{link_model_path, LinkModelFile, Route, RouteLinkModel, LINK_MODEL_FILE};
pub use model::{LevelFit, LinkModel, FORMULA};

//! What the gateway knows about a pod: its metrics page as the engines write it (`prom`), the
//! models it serves (`models`), and the load table the leader publishes of both (`load`).

pub mod load;
pub mod locality;
pub mod models;
pub mod prom;

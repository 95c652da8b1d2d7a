//! What the gateway knows about a pod: its metrics page as the engines write it (`prom`), the
//! models it serves (`models`), the cap on requests it runs at once its polls show (`seats`), and
//! the load table the leader publishes of them (`load`).

pub mod load;
pub mod locality;
pub mod models;
pub mod prom;
pub mod seats;

//! The OpenAI-style protocol as kvroute reads and writes it, with no routing in it: request
//! bodies parsed into the rendering the engines cache (`parse`), the body edits a P/D split
//! makes (`body`), and the cache report a response carries (`usage`); how the engines' servers
//! read a path (`path`) and a body kvroute's strict parse refuses (`lenient`).

pub mod body;
pub mod lenient;
pub mod parse;
pub mod path;
pub mod usage;

//! A job or study submission before anything is stored: [`checks`] parses the spec (every problem at once,
//! with JSON paths) and checks it against the team's data sets, models and the pool's memory;
//! [`named_inputs`] checks an uploaded data set of named inputs; [`schema`] writes the spec's JSON schema
//! into the API document; [`study`] plans, fits and stores a study's points; [`fork`] checks and pins a
//! fork's starting checkpoint; [`enqueue`] is the one way into the team's queue (its room, the store call,
//! what follows), for a submission, a fork, a resume and a study's points.

pub mod checks;
pub mod enqueue;
pub mod fork;
pub mod named_inputs;
pub mod schema;
pub mod study;

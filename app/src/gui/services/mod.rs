//! The UI's side of each engine service: the channel ends that send requests to the engine's
//! background tasks (text, speech, image, remote backends, the in-app server) and receive
//! their events, and the state of what each has loaded. Panels call these; these call no panel.

pub mod image;
pub mod remote;
pub mod server;
pub mod speech;
pub mod text;

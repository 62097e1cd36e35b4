//! How the engine makes HTTP clients (hub downloads, remote models; the tests' clients too).
//!
//! TLS runs on rustls with the `ring` crypto provider, installed here as the process default
//! before the first client is built: reqwest's own default provider, aws-lc, compiles a large C
//! library with cmake, minutes of every cold build on a small machine.

/// A `reqwest` client builder whose TLS is ready to use.
pub fn client_builder() -> reqwest::ClientBuilder {
    // Fails only when a provider is already installed (an earlier call, or the embedding
    // program chose its own), which is just as good.
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
}

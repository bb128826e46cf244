//! The user-facing REST API from the command line (`jobs watch`, `bench submit`): JSON calls with a bearer
//! token, problem+json answers turned into errors that carry the server's detail.

use std::time::Duration;

use anyhow::{bail, Context, Result};
use reqwest::Method;
use serde_json::Value;

#[derive(Debug, Clone)]
pub struct UserApi {
    http: reqwest::Client,
    base: String,
    token: String,
}

impl UserApi {
    pub fn new(base: &str, token: &str) -> UserApi {
        UserApi { http: reqwest::Client::new(), base: base.trim_end_matches('/').to_string(), token: token.into() }
    }

    pub async fn call(&self, method: Method, path: &str, body: Option<&Value>) -> Result<Value> {
        let mut request = self.http.request(method, format!("{}{path}", self.base)).bearer_auth(&self.token);
        if let Some(body) = body {
            request = request.json(body);
        }
        let response = request
            .timeout(Duration::from_secs(30))
            .send()
            .await
            .with_context(|| format!("cannot reach {}", self.base))?;
        let status = response.status();
        let body: Value = response.json().await.unwrap_or(Value::Null);
        if !status.is_success() {
            bail!("{path}: {status}: {}", body["detail"].as_str().unwrap_or("no detail"));
        }
        Ok(body)
    }

    pub async fn get(&self, path: &str) -> Result<Value> {
        self.call(Method::GET, path, None).await
    }
}

//! The `/metrics` endpoint both the agent and the coordinator serve (Prometheus text
//! exposition); what each renders stays with its owner.

use std::sync::Arc;

/// Something that can render Prometheus text (the agent's and the coordinator's metrics).
pub trait RenderMetrics: Send + Sync + 'static {
    fn render(&self) -> String;
}

/// Serves `GET /metrics` on `listener` until the process ends.
pub async fn serve<M: RenderMetrics>(listener: tokio::net::TcpListener, metrics: Arc<M>) {
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let m = metrics.clone();
            async move {
                (
                    [(
                        axum::http::header::CONTENT_TYPE,
                        "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    )],
                    m.render(),
                )
            }
        }),
    );
    if let Err(e) = axum::serve(listener, app).await {
        tracing::error!("metrics server stopped: {e}");
    }
}

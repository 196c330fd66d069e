//! `GET`: a pool's state.

use std::time::Duration;

use crate::clock::now_ms;
use crate::domain::PoolState;
use crate::error::Error;
use crate::keys::PoolId;

use super::{Budget, Service};

impl Service {
    /// `GET`.
    pub async fn inspect(&self, id: PoolId, call: &mut Budget) -> Result<PoolState, Error> {
        let mut ctx = self.ctx(call, Duration::ZERO);
        let record = ctx.load_existing(&id.key()).await?;
        Ok(record.pool.state(now_ms()))
    }
}

//! `DELETE`: a pool removed.

use std::time::Duration;

use crate::error::Error;
use crate::keys::PoolId;

use super::{Budget, Service};

impl Service {
    /// `DELETE`: whether a pool was removed.
    pub async fn delete(&self, id: PoolId, call: &mut Budget) -> Result<bool, Error> {
        let mut ctx = self.ctx(call, Duration::ZERO);
        Ok(ctx.call(ctx.store.delete(&id.key())).await?)
    }
}

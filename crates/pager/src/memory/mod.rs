//! A region's memory as the pager handles it: the reserved virtual range ([`mapping`]), the
//! userfaultfd and page operations over it ([`mem`]), and the memory the kernel pins for I/O,
//! which cannot be paged ([`pinned`]).

pub(crate) mod mapping;
pub(crate) mod mem;
pub(crate) mod pinned;

//! Hostile inputs: agent.

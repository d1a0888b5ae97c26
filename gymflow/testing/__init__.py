"""Test helpers shipped with gymflow (like `temporalio.testing`): a scripted OpenAI-compatible server."""

"""The sandboxed candidate process and what it installs on itself."""

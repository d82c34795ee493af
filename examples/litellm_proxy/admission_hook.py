"""The callbacks module the proxy's config names (``admission_hook.proxy_handler_instance``).

Configured from the environment (``AdmissionHook.from_env``): ADMISSION_URL, ADMISSION_MESH,
ADMISSION_POD (default the hostname), ADMISSION_LANE, ADMISSION_PROVIDER, ADMISSION_POOLS (JSON:
model group -> pool), ADMISSION_TIMEOUT, ADMISSION_MAX_HOLD, ADMISSION_DECLARE_BUDGET. The admission
client itself is made at the first request, in the proxy's event loop.
"""
from admission.integrations.litellm import AdmissionHook

proxy_handler_instance = AdmissionHook.from_env()

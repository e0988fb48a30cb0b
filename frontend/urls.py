from django.contrib.auth import views as auth_views
from django.urls import path

from frontend import views

urlpatterns = [
    path("", views.jobs_page, name="portal-jobs"),
    path("billing/", views.billing_page, name="portal-billing"),
    path("billing/invoices/<int:invoice_id>", views.invoice_page, name="portal-invoice"),
    path("login/", auth_views.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
]
